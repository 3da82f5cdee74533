"""Reads from the pool: public views of one group, pool statistics, and the sampling window's range
(pool.sampling draws from it; the swarm page reads its size)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Q, Sum
from psycopg import sql

from common.composed import placeholders, rendered
from common.errors import NotFound
from pool.models import ModerationStatus, Rollout, Verdict
from sapo_node import protocol
from sapo_node.ids import uuid7_floor

STATS_CACHE_SECONDS = 10

# The window's range of sample numbers (`sample_window`; pool.sampling's draw starts with it). The
# groups of one share have the same created_at: `lo` is the smallest number among the oldest ones
# (ordering by created_at alone picked any of them, and the window then lost the others). Both lookups
# are within one swarm: its numbers come from its own sequence, and both indexes lead with swarm_id,
# so a draw's cost depends on neither the number of swarms nor the size of the others.
# The ledger is partitioned by id (UUIDv7, by month): `id >= id_floor` (`window_id_floor`) keeps both
# lookups in the partitions of the window's ids. Every group of the window is above the floor, so `hi`
# is still at least each of their numbers.
SAMPLE_WINDOW = sql.SQL(
    """SELECT (SELECT sample_seq FROM pool_rollout WHERE sampleable AND swarm_id = {swarm} AND created_at >= {cutoff}
        AND id >= {id_floor} ORDER BY created_at, sample_seq LIMIT 1) AS lo,
       (SELECT max(sample_seq) FROM pool_rollout WHERE sampleable AND swarm_id = {swarm} AND id >= {id_floor}) AS hi"""
).format(**placeholders("swarm", "cutoff", "id_floor"))
_SAMPLE_WINDOW_TEXT = rendered(SAMPLE_WINDOW)


def window_id_floor(cutoff: datetime) -> uuid.UUID:
    """The least id a group created at or after `cutoff` may have: the pool took its id at most
    ID_MAX_AGE_SECONDS old (pool.ingest.id_fits), and an hour more for the time a share waits for its
    turn between the check and the INSERT's clock. The UUIDv4 ids of a pool from before UUIDv7 lie
    anywhere (the DEFAULT partition, read by every draw): those below the floor, about 1 in 160, are not
    drawn until their window has passed."""
    return uuid7_floor(cutoff - timedelta(seconds=protocol.ID_MAX_AGE_SECONDS, hours=1))


def sample_window(cutoff: datetime, swarm_id: int) -> tuple[int, int] | None:
    """The swarm's window's range (lo, hi) of sample numbers: from its oldest sampleable group created
    at or after `cutoff` to the newest sampleable group; None when the window is empty. Two index lookups.
    Every sampleable group of the window has a number in it; numbers of groups moderated out since
    leave holes."""
    with connection.cursor() as cursor:
        cursor.execute(_SAMPLE_WINDOW_TEXT, {"cutoff": cutoff, "swarm": swarm_id, "id_floor": window_id_floor(cutoff)})
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
