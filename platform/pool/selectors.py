"""Reads from the pool: public views of one group, pool statistics, and the sampling window's range
(pool.sampling draws from it; the swarm page reads its size)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Q, Sum
from psycopg import sql

from common.composed import placeholders, rendered
from common.errors import NotFound
from pool.models import ModerationStatus, Rollout, Verdict

STATS_CACHE_SECONDS = 10

# The window's range of sample numbers (`sample_window`; pool.sampling's draw starts with it). The
# groups of one share have the same created_at: `lo` is the smallest number among the oldest ones
# (ordering by created_at alone picked any of them, and the window then lost the others). Both lookups
# are within one swarm: its numbers come from its own sequence, and both indexes lead with swarm_id,
# so a draw's cost depends on neither the number of swarms nor the size of the others.
SAMPLE_WINDOW = sql.SQL(
    """SELECT (SELECT sample_seq FROM pool_rollout WHERE sampleable AND swarm_id = {swarm} AND created_at >= {cutoff}
        ORDER BY created_at, sample_seq LIMIT 1) AS lo,
       (SELECT max(sample_seq) FROM pool_rollout WHERE sampleable AND swarm_id = {swarm}) AS hi"""
).format(**placeholders("swarm", "cutoff"))
_SAMPLE_WINDOW_TEXT = rendered(SAMPLE_WINDOW)


def sample_window(cutoff: datetime, swarm_id: int) -> tuple[int, int] | None:
    """The swarm's window's range (lo, hi) of sample numbers: from its oldest sampleable group created
    at or after `cutoff` to the newest sampleable group; None when the window is empty. Two index lookups.
    Every sampleable group of the window has a number in it; numbers of groups moderated out since
    leave holes."""
    with connection.cursor() as cursor:
        cursor.execute(_SAMPLE_WINDOW_TEXT, {"cutoff": cutoff, "swarm": swarm_id})
        lo, hi = cursor.fetchone()
    if lo is None or hi is None or hi < lo:
        return None
    return lo, hi


def rollout_get_public(*, rollout_id: uuid.UUID) -> Rollout:
    """One group as the public sees it, with its texts (None once they aged out); groups a moderator
    took out are not shown."""
    rollout = (
        Rollout.objects.select_related("node")
        .with_texts()
        .filter(id=rollout_id, moderation_status=ModerationStatus.OK)
        .first()
    )
    if rollout is None:
        raise NotFound("No such rollout.")
    return rollout


def pool_stats(*, use_cache: bool = True) -> dict[str, Any]:
    """Counts over the whole pool (cached for a few seconds: they scan the table)."""
    if use_cache:
        cached = cache.get("pool:stats")
        if cached is not None:
            return cached
    accepted = Q(verdict=Verdict.ACCEPTED)
    totals = Rollout.objects.aggregate(
        groups=Count("id"),
        accepted=Count("id", filter=accepted),
        rejected=Count("id", filter=Q(verdict=Verdict.REJECTED)),
        sampleable=Count("id", filter=Q(sampleable=True)),
        completions=Sum("completion_count"),
    )
    per_dataset = {
        row["dataset"]: {"groups": row["groups"], "accepted": row["accepted"], "sampleable": row["sampleable"]}
        for row in Rollout.objects.values("dataset")
        .annotate(
            groups=Count("id"), accepted=Count("id", filter=accepted), sampleable=Count("id", filter=Q(sampleable=True))
        )
        .order_by("dataset")
    }
    stats = {
        "groups": totals["groups"],
        "accepted": totals["accepted"],
        "rejected": totals["rejected"],
        "sampleable": totals["sampleable"],
        "completions": totals["completions"] or 0,
        "acceptance_rate": (totals["accepted"] / totals["groups"]) if totals["groups"] else None,
        "datasets": per_dataset,
    }
    if use_cache:
        cache.set("pool:stats", stats, STATS_CACHE_SECONDS)
    return stats
