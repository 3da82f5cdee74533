"""Node trust (docs/moderation.md, "Trust").

    trust = (streak + 1) / (streak + 1 + half_streak)

`streak` counts the node's accepted groups since its last rejected one (a verifier rejection or a
moderator's reject resets it to 0). A new node has trust 1 / (1 + half_streak) (0.1 by default); after
half_streak accepted groups in a row it reaches 0.5, and it tends to 1 with a long clean run.

Uses: shown to moderators; scales the node's message quota; optionally weights sampling; optionally
holds a low-trust node's groups for review (rule "low_trust").
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import connection
from django.utils import timezone
from psycopg import sql

from common.composed import placeholders
from common.db import binary_array
from moderation.rules import rules_current


def trust_value(streak: int, half_streak: int) -> float:
    return (streak + 1) / (streak + 1 + half_streak)


def _half_streak() -> int:
    return rules_current()["trust"]["half_streak"]


#: Counting nodes' newly judged groups into their records, as common table expressions (by name) of the pool's
#: INSERT statement (moderation.screening.RECORD_SQL): the groups judged, in the order judged, each
#: with its node and verdict (`trust_judged_params`), those the statement really inserted counted (the
#: pool's CTE `inserted`), one upsert with a row per node, in node order (concurrent batches lock the
#: records in one order). The row's `streak` is the node's new streak if the batch rejected something
#: (the accepted groups after its last rejection), else its accepted groups, which the update adds to
#: the streak it had: `verdict_counts`, in SQL (tests/platform/test_trust.py holds them together).
_P = placeholders("now", binary=("trust_id", "trust_node", "trust_ok"))
TRUST_VERDICTS_CTES: dict[str, sql.Composable] = {
    "trust_judged": sql.SQL("""
    SELECT u.node, u.ok, u.ord,
           coalesce(max(u.ord) FILTER (WHERE NOT u.ok) OVER (PARTITION BY u.node), 0) AS last_rejected
    FROM unnest({trust_id}::uuid[], {trust_node}::bigint[], {trust_ok}::bool[])
         WITH ORDINALITY AS u(id, node, ok, ord)
    WHERE u.id IN (SELECT id FROM inserted)
""").format(**_P),
    "trust": sql.SQL("""
    INSERT INTO moderation_trustrecord AS t (node_id, streak, accepted, rejected, last_rejected_at, updated_at)
    SELECT j.node, count(*) FILTER (WHERE j.ok AND j.ord > j.last_rejected), count(*) FILTER (WHERE j.ok),
           count(*) FILTER (WHERE NOT j.ok), CASE WHEN bool_or(NOT j.ok) THEN {now} END, {now}
    FROM trust_judged j GROUP BY j.node ORDER BY j.node
    ON CONFLICT (node_id) DO UPDATE SET
        streak = CASE WHEN EXCLUDED.rejected > 0 THEN EXCLUDED.streak ELSE t.streak + EXCLUDED.accepted END,
        accepted = t.accepted + EXCLUDED.accepted,
        rejected = t.rejected + EXCLUDED.rejected,
        last_rejected_at = COALESCE(EXCLUDED.last_rejected_at, t.last_rejected_at),
        updated_at = EXCLUDED.updated_at
""").format(**_P),
}
#: TRUST_VERDICTS_CTES's names, for moderation.screening.RECORD_SQL's declaration.
TRUST_CTE_NAMES = frozenset(TRUST_VERDICTS_CTES)
TRUST_PARAM_NAMES = frozenset({"trust_id", "trust_node", "trust_ok"})


@dataclass(frozen=True)
class VerdictCounts:
    """A node's newly judged groups, as its trust record counts them."""

    accepted: int
    rejected: int
    streak: int  # the accepted groups after the last rejection when rejected > 0, else `accepted`


def verdict_counts(verdicts: Sequence[bool]) -> VerdictCounts:
    """Counts for a node's newly judged groups in the order judged (True = accepted): a rejection
    restarts the streak at the accepted groups after the batch's last rejection. The definition
    TRUST_VERDICTS_CTES computes in SQL."""
    accepted = sum(1 for v in verdicts if v)
    tail = 0  # accepted groups after the last rejection
    for v in reversed(verdicts):
        if not v:
            break
        tail += 1
    rejected = len(verdicts) - accepted
    return VerdictCounts(accepted, rejected, tail if rejected else accepted)


def trust_judged_params(judged: Sequence[tuple[uuid.UUID, int, bool]]) -> dict[str, object]:
    """TRUST_VERDICTS_CTES's parameters: the groups judged, in the order judged, as (id, node id,
    accepted)."""
    return {
        "trust_id": binary_array("uuid", [rid for rid, _, _ in judged]),
        "trust_node": binary_array("int8", [node for _, node, _ in judged]),
        "trust_ok": binary_array("bool", [ok for _, _, ok in judged]),
    }


def trust_reset(*, node_ids: Iterable[int], rejected_counts: dict[int, int] | None = None) -> None:
    """A moderator rejected groups of these nodes: their streaks restart at 0 (one upsert)."""
    node_ids = sorted(set(node_ids))
    if not node_ids:
        return
    counts = rejected_counts or {}
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO moderation_trustrecord AS t
                (node_id, streak, accepted, rejected, last_rejected_at, updated_at)
            SELECT n, 0, 0, c, %(now)s, %(now)s FROM unnest(%(nodes)s::bigint[], %(counts)s::int[]) AS x(n, c)
            ON CONFLICT (node_id) DO UPDATE SET
                streak = 0, rejected = t.rejected + EXCLUDED.rejected,
                last_rejected_at = EXCLUDED.last_rejected_at, updated_at = EXCLUDED.updated_at
            """,
            {"nodes": node_ids, "counts": [counts.get(n, 0) for n in node_ids], "now": now},
        )


def trust_for_nodes(node_ids: Iterable[int]) -> dict[int, float]:
    """Trust per node id (nodes without a record: a new node's trust). One query."""
    node_ids = set(node_ids)
    half = _half_streak()
    # Raw SQL: every node socket reads its quota from this when it opens, and the ORM's query costs
    # several times the CPU of this one (docs/benchmarks.md, "Sockets").
    with connection.cursor() as cursor:
        cursor.execute("SELECT node_id, streak FROM moderation_trustrecord WHERE node_id = ANY(%s)", [sorted(node_ids)])
        streaks = dict(cursor.fetchall())
    return {n: trust_value(streaks.get(n, 0), half) for n in node_ids}


def node_message_quotas(*, node_ids: Sequence[int], base: int) -> dict[int, int]:
    """Messages per minute allowed to each node: base * (floor + (1 - floor) * trust) when the "trust"
    rule is enabled, else base. Never below 1. One query for all of them (sockets opening together
    ask together: sockets.opening)."""
    rule = rules_current()["trust"]
    if not rule.enabled:
        return dict.fromkeys(node_ids, base)
    floor = rule["quota_floor"]
    trust = trust_for_nodes(node_ids)
    return {n: max(1, int(base * (floor + (1 - floor) * trust[n]))) for n in trust}


def sample_acceptance(trust: float, *, floor: float) -> float:
    """Probability of keeping a uniformly drawn group of a node with this trust: floor + (1-floor)*trust.
    Over the draw, a group is kept with probability proportional to its weight (max weight 1)."""
    return floor + (1 - floor) * trust


def sample_keep(*, node_ids: Sequence[int], rng: random.Random) -> list[bool] | None:
    """For groups drawn uniformly at random (by their authors' ids, in draw order): whether to keep each,
    with probability floor + (1 - floor) * trust(author). None when trust weighting is off (keep all).

    Rejection sampling on the uniform draw: a kept group is drawn with probability proportional to its
    acceptance, and the cost per draw stays flat (one query for the authors' trust, however big the pool).
    """
    rule = rules_current()["trust"]
    if not rule["sample_weighting"] or not node_ids:
        return None
    trust = trust_for_nodes(node_ids)
    floor = rule["sample_floor"]
    return [rng.random() < sample_acceptance(trust[n], floor=floor) for n in node_ids]


def weighted_pick(*, candidates: Sequence[tuple[object, int]], n: int, rng: random.Random) -> list[object] | None:
    """Up to `n` of the (group id, author node id) candidates, drawn by the same rejection rule as
    `sample_keep` (uniform draw among those left, kept with the author's acceptance), in draw order.
    None when trust weighting is off: the caller then draws uniformly as usual. One query."""
    rule = rules_current()["trust"]
    if not rule["sample_weighting"]:
        return None
    left = list(candidates)
    if not left or n <= 0:
        return []
    trust = trust_for_nodes({node_id for _, node_id in left})
    floor = rule["sample_floor"]
    picked: list[object] = []
    while left and len(picked) < n:
        i = rng.randrange(len(left))
        rollout_id, node_id = left[i]
        if rng.random() < sample_acceptance(trust[node_id], floor=floor):
            picked.append(rollout_id)
            left[i] = left[-1]
            left.pop()
    return picked
