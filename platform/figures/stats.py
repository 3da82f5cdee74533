"""Folding the pool into the small tables of figures.models, and reading figures back in one snapshot.

Why: the pool may hold millions of groups; no page may scan it. Groups older than FOLD_LAG are
added to per-node totals (NodeStats), per-node hours (NodeHour) and per-dataset hours (DatasetHour)
once, by `stats_fold`, which runs at most every FOLD_EVERY seconds (lazily from readers, or from
`manage.py sapo_stats fold`). Readers add the rows newer than the cursor ("live" rows: a few
minutes' worth, found through the pool's (node, created_at) index for the nodes active since then).
Both parts are read in one REPEATABLE READ snapshot, so a fold committing meanwhile is never
counted twice or missed. docs/figures.md explains each figure.

The lag exists because a group's `created_at` is taken before its transaction commits: a fold that
stopped exactly at "now" could miss a group committed a moment later with an earlier time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone
from psycopg import sql

from figures import credit
from figures.models import StatsCursor
from pool.models import Rollout
from pool.signals import rollouts_moderation_changing

FOLD_LAG = timedelta(minutes=2)
FOLD_EVERY_SECONDS = 15
#: Nodes whose last activity (last_seen_at, or the pool's verdict-count update at ingest) is this much
#: older than the fold's start cannot have written rows in the folded range.
ACTIVITY_MARGIN = timedelta(minutes=5)
_LOCK_KEY = 0x5A90_57A7  # pg advisory lock id of the fold
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
_MEASURES = ("accepted", "rejected", "moderated", "completions", "reward", "growth")
_FOLDED_TABLES = (
    "figures_nodestats",
    "figures_nodeswarmstats",
    "figures_nodehour",
    "figures_nodeswarmhour",
    "figures_datasethour",
)


def _groups_sql(where: sql.Composable) -> sql.Composed:
    """One row per (node, hour, dataset, swarm) of the groups matching `where` (over `pool_rollout r`),
    with their additive figures (figures.credit)."""
    return sql.SQL(
        "SELECT r.node_id, date_trunc('hour', r.created_at) AS hour, r.dataset, r.swarm_id, {measures} "
        "FROM pool_rollout r {lateral} WHERE {where} GROUP BY 1, 2, 3, 4"
    ).format(measures=credit.measures(_MEASURES), lateral=credit.credit_lateral(), where=where)


@dataclass
class Measures:
    """Additive figures of a set of groups."""

    accepted: int = 0
    rejected: int = 0
    moderated: int = 0
    completions: int = 0
    reward: float = 0.0
    growth: float = 0.0

    def add(self, other: Measures) -> None:
        self.accepted += other.accepted
        self.rejected += other.rejected
        self.moderated += other.moderated
        self.completions += other.completions
        self.reward += other.reward
        self.growth += other.growth


#: Each folded column and the Measures field it holds, in the tables' order: the one mapping between the
#: figures tables' rows and Measures (an hour's row keeps no moderated groups and no growth).
MEASURE_COLUMNS = {
    "accepted_groups": "accepted",
    "rejected_groups": "rejected",
    "moderated_groups": "moderated",
    "credited_completions": "completions",
    "verified_reward": "reward",
    "credit_growth": "growth",
}
_HOUR_COLUMNS = ["accepted_groups", "rejected_groups", "credited_completions", "verified_reward"]


def measures_of(row: Any) -> Measures:
    """The Measures a folded row holds (NodeStats, NodeSwarmStats, NodeHour, NodeSwarmHour, DatasetHour);
    a column the row's table does not have counts 0."""
    return Measures(**{f: getattr(row, c) for c, f in MEASURE_COLUMNS.items() if hasattr(row, c)})


def measures_values(m: Measures, columns: Sequence[str]) -> tuple:
    """`m`'s values for these folded columns, in their order (a row to write)."""
    return tuple(getattr(m, MEASURE_COLUMNS[c]) for c in columns)


@dataclass
class GroupRows:
    """Groups of a time range, grouped five ways."""

    by_node: dict[int, Measures] = field(default_factory=dict)
    by_node_swarm: dict[tuple[int, int], Measures] = field(default_factory=dict)
    by_node_hour: dict[tuple[int, datetime], Measures] = field(default_factory=dict)
    #: (node id, swarm id, hour)
    by_node_swarm_hour: dict[tuple[int, int, datetime], Measures] = field(default_factory=dict)
    #: (swarm id, dataset, hour)
    by_dataset_hour: dict[tuple[int, str, datetime], Measures] = field(default_factory=dict)


def _group_rows(*, start: datetime | None, end: datetime | None, node_ids: Sequence[int] | None) -> GroupRows:
    rows = GroupRows()
    if node_ids is not None and not node_ids:
        return rows
    where = [sql.SQL("r.created_at >= %(start)s AND r.created_at < %(end)s")]
    if node_ids is not None:
        where.append(sql.SQL("r.node_id = ANY(%(nodes)s)"))
    params = {
        "start": start or datetime(1970, 1, 1, tzinfo=UTC),
        "end": end or _FAR_FUTURE,
        "nodes": list(node_ids or []),
    }
    with connection.cursor() as cursor:
        cursor.execute(_groups_sql(sql.SQL(" AND ").join(where)), params)
        for node_id, hour, dataset, swarm_id, *values in cursor.fetchall():
            m = Measures(
                int(values[0]), int(values[1]), int(values[2]), int(values[3]), float(values[4]), float(values[5])
            )
            rows.by_node.setdefault(node_id, Measures()).add(m)
            rows.by_node_swarm.setdefault((node_id, swarm_id), Measures()).add(m)
            rows.by_node_hour.setdefault((node_id, hour), Measures()).add(m)
            rows.by_node_swarm_hour.setdefault((node_id, swarm_id, hour), Measures()).add(m)
            rows.by_dataset_hour.setdefault((swarm_id, dataset, hour), Measures()).add(m)
    return rows


def _counts_by(table: str, column: str, *, after_id: int, up_to_id: int | None) -> dict[tuple[int, int], int]:
    """Rows of `table` with after_id < id <= up_to_id (no upper bound: None), counted per (`column`, swarm)."""
    where = [sql.SQL("id > %(lo)s")]
    if up_to_id is not None:
        where.append(sql.SQL("id <= %(hi)s"))
    query = sql.SQL("SELECT {column}, swarm_id, count(*) FROM {table} WHERE {where} GROUP BY 1, 2").format(
        column=sql.Identifier(column), table=sql.Identifier(table), where=sql.SQL(" AND ").join(where)
    )
    with connection.cursor() as cursor:
        cursor.execute(query, {"lo": after_id, "hi": up_to_id})
        return {(key, swarm_id): n for key, swarm_id, n in cursor.fetchall()}


def _totals(counts: dict[tuple[int, int], int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for (key, _), n in counts.items():
        out[key] = out.get(key, 0) + n
    return out


def _last_id_before(table: str, *, after_id: int, cutoff: datetime) -> int:
    query = sql.SQL("SELECT max(id) FROM {table} WHERE id > %s AND created_at < %s").format(table=sql.Identifier(table))
    with connection.cursor() as cursor:
        cursor.execute(query, [after_id, cutoff])
        (value,) = cursor.fetchone()
    return after_id if value is None else int(value)


def active_node_ids(since: datetime) -> list[int]:
    """Nodes that may have written groups since `since` (seen, or their verdict counts touched at ingest)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT n.id FROM nodes_node n LEFT JOIN pool_nodeverdictcounts t ON t.node_id = n.id
            WHERE n.last_seen_at >= %(since)s OR t.updated_at >= %(since)s
            """,
            {"since": since - ACTIVITY_MARGIN},
        )
        return [row[0] for row in cursor.fetchall()]


def _names(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _upsert_add(table: str, keys: Sequence[str], columns: Sequence[str], rows: list[tuple]) -> None:
    """INSERT rows (keys + columns); on conflict add the columns to the stored values."""
    if not rows:
        return
    names = [*keys, *columns]
    query = sql.SQL("INSERT INTO {table} ({names}) VALUES ({values}) ON CONFLICT ({keys}) DO UPDATE SET {sets}").format(
        table=sql.Identifier(table),
        names=_names(names),
        values=sql.SQL(", ").join(sql.Placeholder() for _ in names),
        keys=_names(keys),
        sets=sql.SQL(", ").join(
            sql.SQL("{c} = {t}.{c} + EXCLUDED.{c}").format(c=sql.Identifier(c), t=sql.Identifier(table))
            for c in columns
        ),
    )
    with connection.cursor() as cursor:
        cursor.executemany(query, rows)


def _update_add(table: str, keys: Sequence[str], columns: Sequence[str], rows: list[tuple]) -> None:
    """UPDATE existing rows: add the values (columns first, then the keys, in each row)."""
    if not rows:
        return
    query = sql.SQL("UPDATE {table} SET {sets} WHERE {where}").format(
        table=sql.Identifier(table),
        sets=sql.SQL(", ").join(sql.SQL("{c} = {c} + %s").format(c=sql.Identifier(c)) for c in columns),
        where=sql.SQL(" AND ").join(sql.SQL("{k} = %s").format(k=sql.Identifier(k)) for k in keys),
    )
    with connection.cursor() as cursor:
        cursor.executemany(query, rows)


_STATS_COLUMNS = [*MEASURE_COLUMNS, "helped", "rounds"]


def _stats_row(m: Measures, helped: int, rounds: int) -> tuple:
    return (*measures_values(m, MEASURE_COLUMNS), helped, rounds)


def _write(groups: GroupRows, helped: dict[tuple[int, int], int], rounds: dict[tuple[int, int], int]) -> None:
    pairs = set(groups.by_node_swarm) | set(helped) | set(rounds)
    existing = _existing_node_ids({node_id for node_id, _ in pairs})
    helped_total, rounds_total = _totals(helped), _totals(rounds)
    totals = [
        (
            node_id,
            *_stats_row(
                groups.by_node.get(node_id, Measures()), helped_total.get(node_id, 0), rounds_total.get(node_id, 0)
            ),
        )
        for node_id in sorted(existing)
    ]
    _upsert_add("figures_nodestats", ["node_id"], _STATS_COLUMNS, totals)
    per_swarm = [
        (n, s, *_stats_row(groups.by_node_swarm.get((n, s), Measures()), helped.get((n, s), 0), rounds.get((n, s), 0)))
        for n, s in sorted(pairs)
        if n in existing
    ]
    _upsert_add("figures_nodeswarmstats", ["node_id", "swarm_id"], _STATS_COLUMNS, per_swarm)
    _upsert_add(
        "figures_nodehour",
        ["node_id", "hour"],
        _HOUR_COLUMNS,
        [
            (n, h, *measures_values(m, _HOUR_COLUMNS))
            for (n, h), m in sorted(groups.by_node_hour.items())
            if n in existing
        ],
    )
    _upsert_add(
        "figures_nodeswarmhour",
        ["node_id", "swarm_id", "hour"],
        _HOUR_COLUMNS,
        [
            (n, s, h, *measures_values(m, _HOUR_COLUMNS))
            for (n, s, h), m in sorted(groups.by_node_swarm_hour.items())
            if n in existing
        ],
    )
    _upsert_add(
        "figures_datasethour",
        ["swarm_id", "hour", "dataset"],
        _HOUR_COLUMNS,
        [(s, h, d, *measures_values(m, _HOUR_COLUMNS)) for (s, d, h), m in sorted(groups.by_dataset_hour.items())],
    )


def _existing_node_ids(node_ids: set[int]) -> set[int]:
    if not node_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM nodes_node WHERE id = ANY(%s)", [sorted(node_ids)])
        return {row[0] for row in cursor.fetchall()}


def stats_fold(*, now: datetime | None = None) -> bool:
    """Add the pool's rows older than FOLD_LAG that are not yet counted. Returns False when another
    fold holds the lock (it is doing the same work). The first fold counts the whole pool."""
    target = (now or timezone.now()) - FOLD_LAG
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return False
        cursor_row = StatsCursor.objects.filter(id=1).first()
        start = cursor_row.folded_until if cursor_row else None
        after_consumption = cursor_row.consumption_id if cursor_row else 0
        after_round = cursor_row.round_id if cursor_row else 0
        if start is not None and target <= start:
            target = start
        node_ids = None if start is None else active_node_ids(start)
        groups = (
            _group_rows(start=start, end=target, node_ids=node_ids) if start is None or target > start else GroupRows()
        )
        consumption_to = _last_id_before("pool_consumption", after_id=after_consumption, cutoff=target)
        round_to = _last_id_before("pool_noderound", after_id=after_round, cutoff=target)
        helped = _counts_by("pool_consumption", "author_id", after_id=after_consumption, up_to_id=consumption_to)
        rounds = _counts_by("pool_noderound", "node_id", after_id=after_round, up_to_id=round_to)
        _write(groups, helped, rounds)
        StatsCursor.objects.update_or_create(
            id=1,
            defaults={
                "folded_until": target,
                "consumption_id": consumption_to,
                "round_id": round_to,
                "updated_at": timezone.now(),
            },
        )
    return True


def stats_fold_job() -> str:
    """The scheduled fold (ops.scheduled): pages fold lazily too, this keeps figures fresh without visits."""
    return "folded" if stats_fold() else "another fold is running"


def stats_fold_if_due() -> None:
    """Fold at most once per FOLD_EVERY_SECONDS per cache (readers call this)."""
    if cache.add("web:stats:fold-due", 1, FOLD_EVERY_SECONDS):
        stats_fold()


@transaction.atomic
def node_stats_apply_moderation(*, rollouts: QuerySet[Rollout] | Iterable[uuid.UUID], status: str) -> int:
    """Move the credit of already-folded groups whose moderation status is about to become `status`.

    Connected to pool.signals.rollouts_moderation_changing (FiguresConfig.ready), which
    pool.services.rollout_set_moderation sends in its transaction just before the change: it reads the
    groups' current (old) status. Groups newer than the fold
    need nothing (readers compute them live). Returns how many folded groups changed credit.
    """
    return _apply_credit_change(
        rollouts, lambda r: credit.is_credited(r.verdict, status, r.audit_state), sign_moderated=True
    )


@transaction.atomic
def node_stats_apply_audit(*, rollouts: QuerySet[Rollout] | Iterable[uuid.UUID], audit_state: str) -> int:
    """Move the credit of already-folded groups whose audit state is about to become `audit_state`
    (audits.services calls it in its transaction, before the change). Returns how many folded groups
    changed credit."""
    return _apply_credit_change(
        rollouts, lambda r: credit.is_credited(r.verdict, r.moderation_status, audit_state), sign_moderated=False
    )


def _apply_credit_change(
    rollouts: QuerySet[Rollout] | Iterable[uuid.UUID],
    credited_after: Callable[[Rollout], bool],
    *,
    sign_moderated: bool,
) -> int:
    """The folded figures of the groups whose credit `credited_after` changes, moved by their credit.
    `sign_moderated`: a moderation change, counted in moderated_groups (an audit's is not)."""
    queryset = rollouts if isinstance(rollouts, QuerySet) else Rollout.objects.filter(id__in=list(rollouts))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])  # no fold in between
    cursor_row = StatsCursor.objects.filter(id=1).first()
    if cursor_row is None:
        return 0
    changing = [
        r
        for r in queryset.filter(verdict=credit.ACCEPTED, created_at__lt=cursor_row.folded_until).only(
            "id",
            "node_id",
            "swarm_id",
            "dataset",
            "verdict",
            "created_at",
            "completion_count",
            "verified_rewards",
            "moderation_status",
            "audit_state",
        )
        if credit.is_credited(r.verdict, r.moderation_status, r.audit_state) != credited_after(r)
    ]
    totals: dict[tuple[int, ...], Measures] = {}
    per_swarm: dict[tuple[int, ...], Measures] = {}
    node_hours: dict[tuple[int, ...], Measures] = {}
    node_swarm_hours: dict[tuple[int, ...], Measures] = {}
    dataset_hours: dict[tuple[int, datetime, str], Measures] = {}
    for r in changing:
        sign = 1 if credited_after(r) else -1
        reward = credit.group_reward(r.verified_rewards, r.completion_count)
        hour = r.created_at.replace(minute=0, second=0, microsecond=0)
        for key, bucket in (((r.node_id,), totals), ((r.node_id, r.swarm_id), per_swarm)):
            t = bucket.setdefault(key, Measures())
            t.moderated -= sign if sign_moderated else 0  # moderated_groups moves the other way
            t.completions += sign * r.completion_count
            t.reward += sign * reward
            t.growth += sign * credit.growth_of(reward, r.created_at)
        for key, bucket in (
            ((r.node_id, hour), node_hours),
            ((r.node_id, r.swarm_id, hour), node_swarm_hours),
            ((r.swarm_id, hour, r.dataset), dataset_hours),
        ):
            b = bucket.setdefault(key, Measures())
            b.completions += sign * r.completion_count
            b.reward += sign * reward
    # Folded groups have their rows already: add to them in place.
    stats, hours = _MOVED_STATS_COLUMNS, _MOVED_HOUR_COLUMNS
    _update_add("figures_nodestats", ["node_id"], stats, _delta_rows(totals, stats))
    _update_add("figures_nodeswarmstats", ["node_id", "swarm_id"], stats, _delta_rows(per_swarm, stats))
    _update_add("figures_nodehour", ["node_id", "hour"], hours, _delta_rows(node_hours, hours))
    _update_add("figures_nodeswarmhour", ["node_id", "swarm_id", "hour"], hours, _delta_rows(node_swarm_hours, hours))
    _update_add("figures_datasethour", ["swarm_id", "hour", "dataset"], hours, _delta_rows(dataset_hours, hours))
    return len(changing)


#: What moderation moves in a node's totals and in an hour's row (a group stays accepted as it was shared).
_MOVED_STATS_COLUMNS = ["moderated_groups", "credited_completions", "verified_reward", "credit_growth"]
_MOVED_HOUR_COLUMNS = ["credited_completions", "verified_reward"]


def _delta_rows(bucket: dict[tuple, Measures], columns: list[str]) -> list[tuple]:
    """`_update_add`'s rows: each key's values for `columns`, then the key."""
    return [(*measures_values(m, columns), *key) for key, m in sorted(bucket.items())]


def _follow_moderation(sender: object, *, rollouts: QuerySet[Rollout], status: str, **kwargs: object) -> None:
    node_stats_apply_moderation(rollouts=rollouts, status=status)


def follow_moderation() -> None:
    """Keep the folded figures in step with moderation (FiguresConfig.ready)."""
    rollouts_moderation_changing.connect(_follow_moderation, dispatch_uid="figures.stats.follow_moderation")


@transaction.atomic
def stats_rebuild() -> None:
    """Forget every folded figure and fold the whole pool again (after a moderation sweep, or to
    recount from scratch). Takes the fold's lock for the whole transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        for table in _FOLDED_TABLES:
            cursor.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
    StatsCursor.objects.filter(id=1).delete()
    stats_fold()


# ---------------------------------------------------------------------------- reading


@dataclass
class Live:
    """What the fold has not counted yet, as of one snapshot. `helped` and `rounds` per (node, swarm)."""

    cursor: StatsCursor | None
    groups: GroupRows
    helped: dict[tuple[int, int], int]
    rounds: dict[tuple[int, int], int]

    @property
    def since(self) -> datetime | None:
        return self.cursor.folded_until if self.cursor else None


@contextmanager
def snapshot() -> Iterator[None]:
    """One consistent view of folded tables and pool rows (REPEATABLE READ), when not already inside
    a transaction (then that transaction's view is used: tests, nested callers)."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


def live_rows(*, node_ids: Sequence[int] | None = None) -> Live:
    """The rows newer than the fold (call inside `snapshot()`); `node_ids` narrows to those nodes."""
    cursor_row = StatsCursor.objects.filter(id=1).first()
    if cursor_row is None:
        # Nothing folded yet: everything is live (only before the first fold ever).
        groups = _group_rows(start=None, end=None, node_ids=node_ids)
        return Live(
            None,
            groups,
            _counts_by("pool_consumption", "author_id", after_id=0, up_to_id=None),
            _counts_by("pool_noderound", "node_id", after_id=0, up_to_id=None),
        )
    active = active_node_ids(cursor_row.folded_until)
    if node_ids is not None:
        active = sorted(set(active) & set(node_ids))
    groups = _group_rows(start=cursor_row.folded_until, end=None, node_ids=active)
    helped = _counts_by("pool_consumption", "author_id", after_id=cursor_row.consumption_id, up_to_id=None)
    rounds = _counts_by("pool_noderound", "node_id", after_id=cursor_row.round_id, up_to_id=None)
    return Live(cursor_row, groups, helped, rounds)
