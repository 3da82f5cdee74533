"""Writes to the pool: sharing groups (verify, store, count), moderation status, round reports.

Every function is synchronous and runs its own transaction; consumers call them through
`database_sync_to_async`. Side effects on the channel layer happen on commit only.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.apps import apps
from django.db import connection, transaction
from django.db.models import BigIntegerField, BooleanField, Case, F, Q, QuerySet, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from common.errors import ApplicationError
from pool.messages import Report, RolloutIn
from pool.models import SAMPLE_SEQUENCE, Consumption, ModerationStatus, NodeRound, Rollout, Verdict
from pool.verification import Verification, has_variance, verify_rollout
from sapo_node.tasks import Catalogue


def moderation_hooks() -> Any:
    """moderation.hooks when the moderation app is installed (automatic rules, trust), else None."""
    if not apps.is_installed("moderation"):
        return None
    from moderation import hooks

    return hooks


#: Channel-layer group that hears about newly accepted groups (live pages); message type "pool.shared".
POOL_FEED_GROUP = "pool-feed"


@dataclass
class ShareResult:
    accepted: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)  # [{"id", "reason"}]


# One statement per share: arrays in, one row per group, ON CONFLICT for concurrent replays, and a
# sample number drawn only for rows that become sampleable. Parameters are bound server-side
# (psycopg's default) rather than quoted into the SQL text as Django's cursor does: quoting the
# completions was most of the ORM bulk_create's cost (docs/benchmarks.md, "Pool"). The arrays go in
# binary (%(...)b): text format escapes every element with a regular expression.
_INSERT_SQL = """
WITH inserted AS (
INSERT INTO pool_rollout (id, node_id, round, dataset, seed, index, question, answer, completions,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, created_at)
SELECT u.id, %(node)s, u.round, u.dataset, u.seed, u.index, u.question, u.answer, u.completions::jsonb,
       u.completion_count, u.claimed::jsonb, u.verified::jsonb, u.verdict, u.reason, 'ok',
       u.has_variance, u.sampleable,
       CASE WHEN u.sampleable THEN nextval('pool_rollout_sample_seq') END, %(now)s
FROM unnest(%(id)b::uuid[], %(round)b::int[], %(dataset)b::text[], %(seed)b::bigint[], %(index)b::bigint[],
            %(question)b::text[], %(answer)b::text[], %(completions)b::text[], %(count)b::int[],
            %(claimed)b::text[], %(verified)b::text[], %(verdict)b::text[], %(reason)b::text[],
            %(has_variance)b::bool[], %(sampleable)b::bool[])
     AS u(id, round, dataset, seed, index, question, answer, completions, completion_count, claimed,
          verified, verdict, reason, has_variance, sampleable)
ON CONFLICT (id) DO NOTHING
RETURNING id, verdict
), counts AS (
    SELECT count(*) FILTER (WHERE verdict = 'accepted') AS a, count(*) FILTER (WHERE verdict <> 'accepted') AS r
    FROM inserted
), verdict_counts AS (
    INSERT INTO pool_nodeverdictcounts AS t (node_id, accepted_groups, rejected_groups, updated_at)
    SELECT %(node)s, a, r, now() FROM counts WHERE a + r > 0
    ON CONFLICT (node_id) DO UPDATE SET
        accepted_groups = t.accepted_groups + EXCLUDED.accepted_groups,
        rejected_groups = t.rejected_groups + EXCLUDED.rejected_groups,
        updated_at = now()
)
SELECT id FROM inserted
"""
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _insert_rollouts(node_id: int, rollouts: list[RolloutIn], checks: dict[uuid.UUID, Verification]) -> set[uuid.UUID]:
    """Insert the groups and count their verdicts (NodeVerdictCounts), in one statement (the caller
    holds a transaction); return the ids actually inserted (an id already stored is left alone)."""
    verdicts = [checks[r.id] for r in rollouts]
    variance = [c.accepted and has_variance(c.verified_rewards) for c in verdicts]
    params = {
        "node": node_id,
        "now": timezone.now(),
        "id": [r.id for r in rollouts],
        "round": [r.round for r in rollouts],
        "dataset": [r.dataset for r in rollouts],
        "seed": [r.seed for r in rollouts],
        "index": [r.index for r in rollouts],
        "question": [r.question for r in rollouts],
        "answer": [r.answer for r in rollouts],
        "completions": [_dumps(r.completions) for r in rollouts],
        "count": [len(r.completions) for r in rollouts],
        "claimed": [_dumps(r.rewards) for r in rollouts],
        "verified": [None if c.verified_rewards is None else _dumps(c.verified_rewards) for c in verdicts],
        "verdict": [c.verdict for c in verdicts],
        "reason": [c.reason for c in verdicts],
        "has_variance": variance,
        "sampleable": variance,  # a new group's moderation is "ok": sampleable iff accepted with variance
    }
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_INSERT_SQL, params)
        return {row[0] for row in cursor.fetchall()}


def _count_verdicts(node_id: int, accepted: int, rejected: int) -> None:
    if not (accepted or rejected):
        return
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pool_nodeverdictcounts AS t (node_id, accepted_groups, rejected_groups, updated_at)
            VALUES (%(node)s, %(a)s, %(r)s, now())
            ON CONFLICT (node_id) DO UPDATE SET
                accepted_groups = t.accepted_groups + EXCLUDED.accepted_groups,
                rejected_groups = t.rejected_groups + EXCLUDED.rejected_groups,
                updated_at = now()
            """,
            {"node": node_id, "a": accepted, "r": rejected},
        )


def _announce(node_id: int, accepted: int) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(
            POOL_FEED_GROUP, {"type": "pool.shared", "node_id": node_id, "accepted": accepted}
        )


def rollout_share(*, node: Any, rollouts: Sequence[RolloutIn], catalogue: Catalogue) -> ShareResult:
    """Verify and store a node's shared groups; answer a verdict per group, in the order sent.

    Idempotent per id: a group already stored for this node gets its stored verdict again and is not
    stored or counted twice; an id stored for another node gets `id_conflict` and nothing is stored.
    Rejected groups are stored with their reason (the contributor's inbox) but never sampleable.
    Each group newly judged is counted in the node's NodeVerdictCounts, id conflicts as rejections
    (the node's trust is moderation's, updated by its hook in the same transaction).
    """
    # Verification is CPU only: done before the transaction opens, so no lock waits on it. A resent
    # group is verified again (resends are rare; a lookup first would cost every share a round trip).
    checks = {r.id: verify_rollout(r, catalogue) for r in rollouts}
    hooks = moderation_hooks()
    screening = hooks.rollouts_screen(node_id=node.id, rollouts=rollouts, checks=checks) if hooks else None
    with transaction.atomic():
        inserted = _insert_rollouts(node.id, list(rollouts), checks)
        if hooks:
            # Same transaction: what a hold rule caught is held before any sample can see it.
            hooks.rollouts_record(node_id=node.id, screening=screening, inserted=inserted)
        others = [r.id for r in rollouts if r.id not in inserted]
        stored = (
            {
                row[0]: row[1:]
                for row in Rollout.objects.filter(id__in=others).values_list("id", "node_id", "verdict", "reason")
            }
            if others
            else {}
        )
        held = screening.held if screening else set()
        result = ShareResult()
        conflicts = sampleable = 0
        for r in rollouts:
            if r.id in inserted:
                check = checks[r.id]
                node_id, verdict, reason = node.id, check.verdict, check.reason
                sampleable += check.accepted and has_variance(check.verified_rewards) and r.id not in held
            else:
                node_id, verdict, reason = stored[r.id]
            if node_id != node.id:
                result.rejected.append({"id": str(r.id), "reason": "id_conflict"})
                conflicts += 1
            elif verdict == Verdict.ACCEPTED:
                result.accepted.append(str(r.id))
            else:
                result.rejected.append({"id": str(r.id), "reason": reason})
        if conflicts:
            _count_verdicts(node.id, 0, conflicts)
        if sampleable:
            transaction.on_commit(lambda: _announce(node.id, sampleable))
    return result


def rollout_set_moderation(*, rollouts: QuerySet[Rollout] | Iterable[uuid.UUID], status: str) -> int:
    """Set the moderation status of groups and keep `sampleable` in step; return the number changed.

    Moving a group back to "ok" makes it sampleable again if it was accepted and has variance; a group
    sampleable for the first time gets a new sample number (drawn from the same sequence).
    """
    if status not in ModerationStatus.values:
        raise ApplicationError("invalid_status", f"unknown moderation status {status!r}")
    queryset = rollouts if isinstance(rollouts, QuerySet) else Rollout.objects.filter(id__in=list(rollouts))
    if status != ModerationStatus.OK:
        return queryset.update(moderation_status=status, sampleable=False)
    eligible = Q(verdict=Verdict.ACCEPTED, has_variance=True)
    return queryset.update(
        moderation_status=status,
        sample_seq=Case(
            When(
                eligible & Q(sample_seq__isnull=True),
                then=RawSQL("nextval(%s)", [SAMPLE_SEQUENCE], output_field=BigIntegerField()),
            ),
            default=F("sample_seq"),
            output_field=BigIntegerField(),
        ),
        sampleable=Case(When(eligible, then=Value(True)), default=Value(False), output_field=BooleanField()),
    )


def node_round_report(*, node: Any, report: Report) -> NodeRound:
    """Store a node's round report (a resent round replaces the figures) and credit what it used.

    Each id in `used` that names another node's accepted group becomes one Consumption row per
    (consumer, group), however often it is reported; unknown, own and rejected ids are ignored.
    """
    with transaction.atomic():
        node_round, _ = NodeRound.objects.update_or_create(
            node=node, round=report.round, defaults={"figures": report.figures, "used_count": len(report.used)}
        )
        if report.used:
            authors = (
                Rollout.objects.filter(id__in=report.used, verdict=Verdict.ACCEPTED)
                .exclude(node_id=node.id)
                .values_list("id", "node_id")
            )
            Consumption.objects.bulk_create(
                [Consumption(consumer=node, rollout_id=rid, author_id=aid, round=report.round) for rid, aid in authors],
                ignore_conflicts=True,
            )
    return node_round


def node_session_open(*, node: Any) -> bool:
    """Count an accepted socket for the node (presence); False if the node or owner is banned now."""
    from nodes.models import Node
    from nodes.services import node_mark_connected

    standing = Node.objects.filter(id=node.id, banned_at__isnull=True, owner__banned_at__isnull=True).exists()
    if standing:
        node_mark_connected(node=node)
    return standing
