"""Prometheus metrics of the platform, defined in one place (docs/deploy.md, "Metrics").

This module imports nothing from the project's apps, so any app may call it: the pool's consumer
and services make one-line calls here. Figures that live in the database (pool size, groups held
for moderation) are not counted here but read when /metrics is scraped (ops.collectors).

Multi-process: with PROMETHEUS_MULTIPROC_DIR set (before start-up), every process writes its
figures there and /metrics of any process reports the sum; see ops.views.metrics.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

#: Seconds; from a cached entry's microseconds to a long propositional_logic group (docs/benchmarks.md).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

NODE_SOCKETS = Gauge(
    "sapo_node_sockets_open",
    "Authenticated node WebSockets open now.",
    multiprocess_mode="livesum",
)
SHARE_MESSAGES = Counter("sapo_share_messages", "Share messages answered (one ack each).")
GROUP_VERDICTS = Counter(
    "sapo_group_verdicts",
    "Verdicts answered on shared groups, by verdict and rejection reason (a resent group is answered again).",
    ["verdict", "reason"],
)
VERIFICATION_SECONDS = Histogram(
    "sapo_verification_seconds",
    "Time to re-verify the groups of one share message (CPU, before the database).",
    buckets=LATENCY_BUCKETS,
)
SHARES_TOGETHER = Histogram(
    "sapo_shares_stored_together",
    "Share messages of different nodes verified and stored in one transaction (pool.turns): 1 while"
    " shares do not wait for a turn, up to SAPO_SHARE_BATCH under load.",
    buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64),
)
SAMPLE_SECONDS = Histogram(
    "sapo_sample_seconds",
    "Time to answer one sample request (the selector and the payload).",
    buckets=LATENCY_BUCKETS,
)


def socket_opened() -> None:
    NODE_SOCKETS.inc()


def socket_closed() -> None:
    NODE_SOCKETS.dec()


def share_answered(result: Any) -> None:
    """Count one share message's verdicts (`result`: pool.ingest.ShareResult)."""
    SHARE_MESSAGES.inc()
    if result.accepted:
        GROUP_VERDICTS.labels(verdict="accepted", reason="").inc(len(result.accepted))
    for rejection in result.rejected:
        GROUP_VERDICTS.labels(verdict="rejected", reason=rejection["reason"]).inc()
