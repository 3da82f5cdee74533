"""A sample's server path, top to bottom (docs/protocol.md, "sample"): what the node socket calls for a
`sample` (sockets.consumers, on a database thread), in order:

1. draw: distinct uniform numbers in the swarm's window of sample numbers, and the eligible groups
   they name (index lookups within the swarm), in rounds until there are enough;
2. keep: moderation's trust weighting keeps or turns away each hit (pool.seams; none: uniform);
3. write: each group's protocol JSON (pool.payloads), the reply's list of them (a RawList);
4. record served: the groups sent are recorded as served to the node (a report's `used` is credited
   only for those, pool.services.node_round_report).

The draw grows neither with the pool nor with the number of swarms (no ORDER BY random()): a swarm's
sampleable groups carry unique numbers from its own sequence (`sample_seq`, given when they become
sampleable), and both sampling indexes lead with swarm_id (docs/architecture.md, "Swarms and the
pool's schema"; docs/benchmarks.md, "Pool").
"""

from __future__ import annotations

import math
import random
import uuid
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import connection
from django.utils import timezone
from psycopg import sql

from common import metrics
from common.compact_json import RawList
from common.composed import placeholders, rendered
from common.db import prepare_hot, server_binding_cursor
from pool.group_columns import GROUP_COLUMNS
from pool.models import Rollout
from pool.payloads import SampledGroup, sampled_group_json
from pool.seams import moderation
from pool.selectors import SAMPLE_WINDOW, window_id_floor
from pool.services import rollout_served_record

# When the window's range of sample numbers is this small, list the eligible groups and pick from
# them; above it, probe random numbers (rejection sampling), a few index lookups per group drawn.
ENUMERATE_BELOW = 512
PROBE_ROUNDS = 6

#: The draw's column for each field of SampledGroup, in its order (the row is read by position): where
#: the pool stores the group's (pool.group_columns: its rewards the verified ones), and its author node's.
_GROUP_COLUMNS = {**GROUP_COLUMNS, "node": ("n", "name"), "node_id": ("r", "node_id")}
assert tuple(_GROUP_COLUMNS) == SampledGroup._fields, "the draw reads a column for each field of SampledGroup"

# One round trip for the common case: the window's range (pool.selectors.SAMPLE_WINDOW), `k` distinct
# uniform numbers in it, and the eligible groups they name (index lookups on the partial sample_seq
# index). Rows come back for every number drawn, with NULL group columns for a miss. The texts are
# pool_rollouttext's (partitioned by day): `t.created_at >= cutoff` lets the planner read the window's
# partitions only (tests/platform/test_retention.py checks the plan). The ledger is partitioned by id
# (UUIDv7, by month): `r.id >= id_floor`, the floor id of the window's start less the ids' greatest
# age at ingest (pool.selectors.window_id_floor), does the same for it (tests/platform/test_sampling.py checks the plan).
_DRAW = sql.SQL(
    """
WITH bounds AS ({window}), draws AS (
    SELECT DISTINCT b.lo + floor(random() * (b.hi - b.lo + 1))::bigint AS k
    FROM bounds b, generate_series(1, {k}) WHERE b.hi >= b.lo
)
SELECT b.lo, b.hi, d.k, {columns}
FROM bounds b
LEFT JOIN draws d ON true
LEFT JOIN (pool_rollout r JOIN nodes_node n ON n.id = r.node_id
           JOIN pool_rollouttext t ON t.rollout_id = r.id AND t.created_at = r.created_at AND t.created_at >= {cutoff})
       ON r.swarm_id = {swarm} AND r.sample_seq = d.k AND r.sampleable AND r.node_id <> {node}
          AND r.created_at >= {cutoff} AND r.id >= {id_floor}
"""
).format(
    window=SAMPLE_WINDOW,
    columns=sql.SQL(", ").join(sql.Identifier(table, column) for table, column in _GROUP_COLUMNS.values()),
    **placeholders("k", "swarm", "node", "cutoff", "id_floor"),
)
# Run on every `sample`: rendered once (common.composed).
_DRAW_TEXT = rendered(_DRAW)


def rollout_sample(
    *,
    node: Any,
    n: int,
    window_seconds: int,
    swarm_id: int,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> RawList:
    """What a `sample` of `n` by `node` is answered with: up to `n` distinct groups drawn uniformly at
    random among the sampleable groups of swarm `swarm_id`'s window (the groups created in the last
    `window_seconds`) that `node` did not write, as the reply's list of each group's protocol JSON;
    the groups are recorded as served to the node."""
    with metrics.SAMPLE_SECONDS.time():
        # 1. draw and 2. keep.
        drawn = _draw(node=node, n=n, window_seconds=window_seconds, swarm_id=swarm_id, now=now, rng=rng)
        # 3. write.
        groups = RawList([sampled_group_json(hit.group) for hit in drawn])
    # 4. record served.
    rollout_served_record(node=node, rollout_ids=[hit.group.id for hit in drawn], now=now)
    return groups


class _Hit(NamedTuple):
    """A group a draw hit, with its sample number. The first draw's groups come from its rows: no
    Rollout is built for them (a draw asks for ~1.3 n + 4 numbers, and building and parsing them all
    is a large part of a `sample`'s CPU, docs/benchmarks.md, "Sockets")."""

    sample_seq: int
    group: SampledGroup


def _draw(
    *,
    node: Any,
    n: int,
    window_seconds: int,
    swarm_id: int,
    now: datetime | None,
    rng: random.Random | None,
) -> list[_Hit]:
    """1. draw, 2. keep: up to `n` groups with their sample numbers.

    The window is the range [lo, hi] of the swarm's sample numbers from its oldest fresh group to the
    newest. The draw picks distinct uniform numbers in that range and keeps those naming an eligible
    group (rejection sampling), in rounds until it has `n`, then keeps a uniform `n` of the hits. The
    procedure treats every eligible group alike whatever the gaps, so the result is an exactly
    uniform random subset (docs/benchmarks.md, "Pool"). Usually one query; each further round is one.
    """
    if n <= 0:
        return []
    rng = rng or random.SystemRandom()
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=window_seconds)
    id_floor = window_id_floor(cutoff)
    lo, hi, tried, hits = _first_draw(node.id, swarm_id, cutoff, id_floor, math.ceil(n * 1.3) + 4)
    if lo is None or hi is None or hi < lo:
        return []
    chosen: list[_Hit] = _keep(hits, tried, rng)
    span = hi - lo + 1
    hit_rate = max(len(chosen) / max(len(tried), 1), 0.02)
    rounds = PROBE_ROUNDS if span > ENUMERATE_BELOW else 0
    for _ in range(rounds):
        need = n - len(chosen)
        if need <= 0 or len(tried) >= span:
            break
        want = min(span - len(tried), math.ceil(need * 1.3 / hit_rate) + 4, 20 * n + 64)
        draws: list[int] = []
        while len(draws) < want:
            k = rng.randint(lo, hi)
            if k not in tried:
                tried.add(k)
                draws.append(k)
        # Only the sample-number index is used (the other conditions are checked here), so the
        # planner cannot prefer a scan of the whole window.
        found = [
            _Hit(r.sample_seq, SampledGroup.of_rollout(r))
            for r in Rollout.objects.filter(swarm_id=swarm_id, sampleable=True, sample_seq__in=draws, id__gte=id_floor)
            .select_related("node")
            .with_texts()
            if r.node_id != node.id and r.created_at >= cutoff and r.completions is not None
        ]
        hit_rate = max(len(found) / len(draws), 0.02)
        chosen.extend(_keep(found, tried, rng))
    if len(chosen) < n and len(tried) < span:
        # Few eligible groups in the range (a small window, or most are the asker's own or moderated
        # out): the eligible groups not drawn yet are all equally likely to come next, so take a
        # uniform pick among them.
        eligible = Rollout.objects.filter(
            swarm_id=swarm_id,
            sampleable=True,
            created_at__gte=cutoff,
            sample_seq__gte=lo,
            sample_seq__lte=hi,
            id__gte=id_floor,
        ).exclude(node_id=node.id)
        chosen_ids = [hit.group.id for hit in chosen]
        rest = list(eligible.exclude(id__in=chosen_ids).values_list("id", "node_id"))
        picked = moderation().weighted_pick(candidates=rest, n=n - len(chosen), rng=rng)
        if picked is None:
            picked = [i for i, _ in rng.sample(rest, min(n - len(chosen), len(rest)))]
        chosen.extend(_fetch(picked))
    return chosen[:n]


def _first_draw(
    node_id: int, swarm_id: int, cutoff: datetime, id_floor: uuid.UUID, k: int
) -> tuple[int | None, int | None, set[int], list[_Hit]]:
    """Run _DRAW: (lo, hi, numbers drawn, groups hit). A row is (lo, hi, k, then _GROUP_COLUMNS, NULL
    for a miss)."""
    # Prepared, with a generic plan (common.db.prepare_hot): planning the statement, with the ledger's
    # months and the texts' days it may read, cost more than running it (docs/benchmarks.md, "Pool");
    # the generic plan leaves out the older months when it starts (initial pruning on `id_floor`) and
    # reads one texts partition per group drawn (run-time pruning on the group's created_at).
    with connection.wrap_database_errors, server_binding_cursor() as cursor:
        cursor.execute(
            _DRAW_TEXT,
            {"cutoff": cutoff, "node": node_id, "swarm": swarm_id, "k": int(k), "id_floor": id_floor},
            prepare=prepare_hot(),
        )
        rows = cursor.fetchall()
    lo, hi = rows[0][0], rows[0][1]
    drawn = {row[2] for row in rows if row[2] is not None}
    return lo, hi, drawn, [_Hit(row[2], SampledGroup(*row[3:])) for row in rows if row[3] is not None]


def _keep(hits: list[_Hit], tried: set[int], rng: random.Random) -> list[_Hit]:
    """2. keep: the hits of one round in a uniform random order, less those trust weighting turns away.

    Without weighting, the first n hits over the rounds are a uniform random n-subset. With it
    (moderation's `sample_keep`), each hit is kept with its author's acceptance and a turned-away
    group may be drawn again later: sequential rejection sampling, picks proportional to weight.
    """
    rng.shuffle(hits)
    keep = moderation().sample_keep(node_ids=[hit.group.node_id for hit in hits], rng=rng) if hits else None
    if keep is None:
        return hits
    for hit, kept in zip(hits, keep, strict=True):
        if not kept:
            tried.discard(hit.sample_seq)
    return [hit for hit, kept in zip(hits, keep, strict=True) if kept]


def _fetch(ids: list[uuid.UUID]) -> list[_Hit]:
    if not ids:
        return []
    rows = {r.id: r for r in Rollout.objects.filter(id__in=ids).select_related("node").with_texts()}
    return [_Hit(rows[i].sample_seq, SampledGroup.of_rollout(rows[i])) for i in ids if i in rows]
