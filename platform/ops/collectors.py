"""Figures read from the database when /metrics is scraped, rather than counted in a process: they
are the same whichever process answers, and survive restarts.

Cost per scrape: one sum over pool_nodeverdictcounts (a row per node), one count over the partial
index of sampleable groups, one count of held groups (a scan of pool_rollout; docs/deploy.md), and
counts over the audits' two partial indexes (open audits, errored ones).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.db import connection
from prometheus_client.core import GaugeMetricFamily, Metric

_POOL_SQL = """
SELECT (SELECT coalesce(sum(accepted_groups), 0) FROM pool_nodeverdictcounts),
       (SELECT coalesce(sum(rejected_groups), 0) FROM pool_nodeverdictcounts),
       (SELECT count(*) FROM pool_rollout WHERE sampleable),
       (SELECT count(*) FROM pool_rollout WHERE moderation_status = 'held')
"""


class PoolCollector:
    """sapo_pool_groups{verdict}, sapo_pool_sampleable_groups, sapo_moderation_held_groups."""

    def collect(self) -> Iterator[Metric]:
        # Raw SQL on purpose: this module observes the pool and moderation without importing them.
        with connection.cursor() as cursor:
            cursor.execute(_POOL_SQL)
            accepted, rejected, sampleable, held = cursor.fetchone()
        groups = GaugeMetricFamily(
            "sapo_pool_groups", "Groups stored in the pool, by the verifier's verdict.", labels=["verdict"]
        )
        groups.add_metric(["accepted"], accepted)
        groups.add_metric(["rejected"], rejected)
        yield groups
        yield GaugeMetricFamily(
            "sapo_pool_sampleable_groups",
            "Groups nodes can be served: accepted, with reward variance, not held or quarantined.",
            value=sampleable,
        )
        yield GaugeMetricFamily("sapo_moderation_held_groups", "Groups held for a moderator's review.", value=held)


_AUDITS_SQL = """
SELECT (SELECT count(*) FROM audits_audit WHERE state = 'uploaded'),
       (SELECT count(*) FROM audits_audit WHERE state = 'errored' AND finished_at >= now() - interval '1 day')
"""


class AuditsCollector:
    """sapo_audits_uploaded, sapo_audits_errored_last_day (docs/audits.md, "The queue")."""

    def collect(self) -> Iterator[Metric]:
        # Raw SQL, as above: ops observes the audits without importing them.
        with connection.cursor() as cursor:
            cursor.execute(_AUDITS_SQL)
            uploaded, errored = cursor.fetchone()
        yield GaugeMetricFamily(
            "sapo_audits_uploaded", "Audits whose checkpoint is in, waiting for (or in) a worker's job.", value=uploaded
        )
        yield GaugeMetricFamily(
            "sapo_audits_errored_last_day",
            "Audits closed errored in the last 24 hours: their job failed every attempt (the site's fault).",
            value=errored,
        )
