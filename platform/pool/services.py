"""Writes to the pool besides sharing (pool.ingest): moderation status, round reports, what was
served (pool.sampling's last step), and the pruning of served records and past hours' storage counts.

Every function is synchronous and commits its own writes (inside a caller's transaction, they are
part of it); the node socket calls them on a database thread (common.db.db_call). None sends
anything to the channel layer.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import BigIntegerField, BooleanField, Case, F, Q, QuerySet, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from common.compact_json import dumps
from common.errors import ApplicationError
from pool.budgets import ROW_OVERHEAD_BYTES, hour_of, storage_charge, storage_check, utf8_len
from pool.limits import Limits, current_limits
from pool.models import (
    AuditReason,
    AuditState,
    Consumption,
    ModerationStatus,
    NodeRound,
    NodeStorageHour,
    Rollout,
    ServedGroup,
    Verdict,
)
from pool.records import Report
from pool.signals import rollouts_moderation_changing
from swarms.models import SAMPLE_SEQUENCE_PREFIX

#: Served-group rows live this long past the sampling window: a node reports what it used within
#: minutes of sampling it.
SERVED_KEEP = timedelta(days=1)
PRUNE_EVERY_SECONDS = 600


def rollout_set_moderation(*, rollouts: QuerySet[Rollout] | Iterable[uuid.UUID], status: str) -> int:
    """Set the moderation status of groups and keep `sampleable` in step; return the number changed.

    Announces the change first (pool.signals.rollouts_moderation_changing, same transaction: the
    leaderboard's folded figures move the groups' credit while the old status is still readable).
    Moving a group back to "ok" makes it sampleable again if it was accepted and has variance; a group
    sampleable for the first time gets a sample number from its swarm's sequence; a group it already
    had keeps it. Any other status takes the groups out of sampling.
    """
    if status not in ModerationStatus.values:
        raise ApplicationError("invalid_status", f"unknown moderation status {status!r}")
    queryset = rollouts if isinstance(rollouts, QuerySet) else Rollout.objects.filter(id__in=list(rollouts))
    with transaction.atomic():
        rollouts_moderation_changing.send(sender=Rollout, rollouts=queryset, status=status)
        return _set_moderation(queryset, status)


def _set_moderation(queryset: QuerySet[Rollout], status: str) -> int:
    if status != ModerationStatus.OK:
        return queryset.update(moderation_status=status, sampleable=False)
    # A group an audit failed over, or one its node shared while held after a failed audit, stays out
    # of sampling whatever its moderation (docs/audits.md).
    eligible = (
        Q(verdict=Verdict.ACCEPTED, has_variance=True)
        & ~Q(audit_state=AuditState.FAILED)
        & ~Q(audit_reason=AuditReason.NODE_HELD)
    )
    return queryset.update(
        moderation_status=status,
        sample_seq=Case(
            When(
                eligible & Q(sample_seq__isnull=True),
                # The row's own swarm's sequence (swarms.models.sample_sequence_name).
                then=RawSQL(
                    "nextval((%s || swarm_id)::regclass)", [SAMPLE_SEQUENCE_PREFIX], output_field=BigIntegerField()
                ),
            ),
            default=F("sample_seq"),
            output_field=BigIntegerField(),
        ),
        sampleable=Case(When(eligible, then=Value(True)), default=Value(False), output_field=BooleanField()),
    )


def node_round_report(*, node: Any, report: Report, limits: Limits | None = None, swarm_id: int) -> NodeRound:
    """Store a node's round report (a resent round replaces the figures) and credit what it used.

    Credit is earned, not claimed: an id in `used` becomes a Consumption row (one per consumer and
    group, however often reported) only if the group is accepted, the pool served it to this node in
    a `samples` reply (ServedGroup), and its author belongs to another contributor. Anything else
    (unknown, own, rejected, never served, a sibling node's) is ignored: a contributor cannot credit
    its own groups from its other nodes, nor anyone's groups it never sampled.

    The report's bytes count against the storage budgets; raises "over_budget" past them. The round is
    the swarm's the node is in (`swarm_id`); a consumption is the swarm's of the group consumed.
    """
    storage_check(node=node, limits=limits or current_limits())
    now = timezone.now()
    with transaction.atomic():
        node_round, _ = NodeRound.objects.update_or_create(
            node=node,
            round=report.round,
            defaults={"figures": report.figures, "used_count": len(report.used), "swarm_id": swarm_id},
        )
        candidates = 0
        if report.used:
            served = ServedGroup.objects.filter(node_id=node.id, rollout_id__in=report.used).values("rollout_id")
            authors = (
                Rollout.objects.filter(id__in=served, verdict=Verdict.ACCEPTED)
                .exclude(node__owner_id=node.owner_id)
                .values_list("id", "node_id", "swarm_id")
            )
            rows = [
                Consumption(consumer=node, rollout_id=r, author_id=a, swarm_id=s, round=report.round)
                for r, a, s in authors
            ]
            Consumption.objects.bulk_create(rows, ignore_conflicts=True)
            candidates = len(rows)
        storage_charge(node.id, ROW_OVERHEAD_BYTES * (1 + candidates) + utf8_len(dumps(report.figures)), now)
    return node_round


def rollout_served_record(*, node: Any, rollout_ids: Sequence[uuid.UUID], now: datetime | None = None) -> None:
    """Remember that these groups were sent to the node in a `samples` reply (what makes a later
    `report.used` of them count): one statement, then, at most every PRUNE_EVERY_SECONDS across the
    processes, the pruning of records past their use (`_prune_if_due`). A group served again keeps its
    first time: a group is sampleable for the sampling window after it was shared, so a record kept
    for the window and a day after it was first served outlives every report that can name it."""
    if not rollout_ids:
        return
    now = now or timezone.now()
    with connection.cursor() as cursor:
        # Bookkeeping, not data: a database crash may lose the last moment's records (a credit or
        # two), so the commit does not wait for the disk (set_config(..., true) lasts for this
        # statement's own transaction; one round trip). Waiting made every `sample` several ms
        # slower (docs/benchmarks.md, "Pool").
        cursor.execute(
            """
            INSERT INTO pool_servedgroup (node_id, rollout_id, served_at)
            SELECT %(node)s, r, %(now)s
            FROM unnest(%(ids)s::uuid[]) AS r, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
            ON CONFLICT (node_id, rollout_id) DO NOTHING
            """,
            # The ids as one array literal (UUIDs need no quoting): psycopg's client-side binding quotes
            # each element of a list, a visible part of a `sample`'s CPU.
            {"node": node.id, "ids": "{" + ",".join(str(uuid.UUID(str(i))) for i in rollout_ids) + "}", "now": now},
        )
    _prune_if_due(now)


_prune_checked_at = -math.inf  # this process's last look at the shared cache key (time.monotonic)


def _prune_if_due(now: datetime) -> None:
    """Drop served-group rows past their use and storage counts of past hours, at most every
    PRUNE_EVERY_SECONDS across the processes (a cache key; an index range each). A process looks at
    the key at most once a second (the look cost more than the rest of a `sample`'s bookkeeping)."""
    global _prune_checked_at
    checked = time.monotonic()
    if checked - _prune_checked_at < 1.0:
        return
    _prune_checked_at = checked
    if not cache.add("pool:prune-due", 1, PRUNE_EVERY_SECONDS):
        return
    window = timedelta(seconds=current_limits().sample_window_seconds)
    ServedGroup.objects.filter(served_at__lt=now - window - SERVED_KEEP).delete()
    NodeStorageHour.objects.filter(hour__lt=hour_of(now) - timedelta(hours=1)).delete()
