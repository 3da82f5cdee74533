"""Folding the pool into the small tables of web.models, and reading figures back in one snapshot.

Why: the pool may hold millions of groups; no page may scan it. Groups older than FOLD_LAG are
added to per-node totals (NodeStats), per-node hours (NodeHour) and per-dataset hours (DatasetHour)
once, by `stats_fold`, which runs at most every FOLD_EVERY seconds (lazily from readers, or from
`manage.py sapo_stats fold`). Readers add the rows newer than the cursor ("live" rows: a few
minutes' worth, found through the pool's (node, created_at) index for the nodes active since then).
Both parts are read in one REPEATABLE READ snapshot, so a fold committing meanwhile is never
counted twice or missed. docs/leaderboard.md explains each figure.

The lag exists because a group's `created_at` is taken before its transaction commits: a fold that
stopped exactly at "now" could miss a group committed a moment later with an earlier time.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from pool.models import Rollout
from pool.signals import rollouts_moderation_changing
from web.models import StatsCursor

FOLD_LAG = timedelta(minutes=2)
FOLD_EVERY_SECONDS = 15
#: Nodes whose last activity (last_seen_at, or the pool's verdict-count update at ingest) is this much
#: older than the fold's start cannot have written rows in the folded range.
ACTIVITY_MARGIN = timedelta(minutes=5)
CREDIT_HALF_LIFE = timedelta(days=7)
#: Reference time of `credit_growth` (2^((t - epoch) / half-life) stays finite until about 2045;
#: stats_rebuild with a later epoch then).
CREDIT_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
LN2 = math.log(2.0)
_LOCK_KEY = 0x5A90_57A7  # pg advisory lock id of the fold
_FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
MODERATED_OUT = ("quarantined", "rejected")

# One row per (node, hour, dataset) of the groups created in [start, end) by the given nodes
# (all nodes when the filter is off). A group is *credited* when accepted and not taken out by
# moderation; its reward is the sum of its verified rewards. The decay is computed in float8: extract()
# gives numeric, whose power() costs ~40 times as much (docs/leaderboard.md, "Cost").
_GROUPS_SQL = """
SELECT r.node_id, date_trunc('hour', r.created_at) AS hour, r.dataset, r.swarm_id,
       count(*) FILTER (WHERE r.verdict = 'accepted') AS accepted,
       count(*) FILTER (WHERE r.verdict = 'rejected') AS rejected,
       count(*) FILTER (WHERE r.verdict = 'accepted' AND NOT c.credited) AS moderated,
       coalesce(sum(r.completion_count) FILTER (WHERE c.credited), 0) AS completions,
       coalesce(sum(c.reward) FILTER (WHERE c.credited), 0) AS reward,
       coalesce(sum(c.reward * power(2.0::float8, extract(epoch FROM r.created_at - %(epoch)s)::float8 / %(half_life)s))
                FILTER (WHERE c.credited), 0) AS growth
FROM pool_rollout r
CROSS JOIN LATERAL (
    SELECT r.verdict = 'accepted' AND r.moderation_status NOT IN ('quarantined', 'rejected') AS credited,
           (SELECT coalesce(sum(x::float8), 0)
              FROM jsonb_array_elements_text(
                   CASE WHEN jsonb_typeof(r.verified_rewards) = 'array' THEN r.verified_rewards ELSE '[]' END
              ) AS x) AS reward
) c
WHERE r.created_at >= %(start)s AND r.created_at < %(end)s {node_filter}
GROUP BY 1, 2, 3, 4
"""


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


@dataclass
class GroupRows:
    """Groups of a time range, grouped three ways."""

    by_node: dict[int, Measures] = field(default_factory=dict)
    by_node_hour: dict[tuple[int, datetime], Measures] = field(default_factory=dict)
    #: (swarm id, dataset, hour)
    by_dataset_hour: dict[tuple[int, str, datetime], Measures] = field(default_factory=dict)


def _group_rows(*, start: datetime | None, end: datetime | None, node_ids: Sequence[int] | None) -> GroupRows:
    params = {
        "epoch": CREDIT_EPOCH,
        "half_life": CREDIT_HALF_LIFE.total_seconds(),
        "start": start or datetime(1970, 1, 1, tzinfo=UTC),
        "end": end or _FAR_FUTURE,
        "nodes": list(node_ids or []),
    }
    rows = GroupRows()
    if node_ids is not None and not node_ids:
        return rows
    sql = _GROUPS_SQL.format(node_filter="" if node_ids is None else "AND r.node_id = ANY(%(nodes)s)")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for node_id, hour, dataset, swarm_id, *values in cursor.fetchall():
            m = Measures(
                int(values[0]), int(values[1]), int(values[2]), int(values[3]), float(values[4]), float(values[5])
            )
            rows.by_node.setdefault(node_id, Measures()).add(m)
            rows.by_node_hour.setdefault((node_id, hour), Measures()).add(m)
            rows.by_dataset_hour.setdefault((swarm_id, dataset, hour), Measures()).add(m)
    return rows


def _counts_by(table: str, column: str, *, after_id: int, up_to_id: int | None) -> dict[int, int]:
    """Rows of `table` with after_id < id <= up_to_id (no upper bound: None), counted per `column`."""
    upper = "" if up_to_id is None else "AND id <= %(hi)s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {column}, count(*) FROM {table} WHERE id > %(lo)s {upper} GROUP BY 1",  # noqa: S608
            {"lo": after_id, "hi": up_to_id},
        )
        return dict(cursor.fetchall())


def _last_id_before(table: str, *, after_id: int, cutoff: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT max(id) FROM {table} WHERE id > %s AND created_at < %s",  # noqa: S608
            [after_id, cutoff],
        )
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


def _upsert_add(table: str, keys: Sequence[str], columns: Sequence[str], rows: list[tuple]) -> None:
    """INSERT rows (keys + columns); on conflict add the columns to the stored values."""
    if not rows:
        return
    names = [*keys, *columns]
    sets = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)
    sql = (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(['%s'] * len(names))}) "  # noqa: S608
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"
    )
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _update_add(table: str, keys: Sequence[str], columns: Sequence[str], rows: list[tuple]) -> None:
    """UPDATE existing rows: add the values (columns first, then the keys, in each row)."""
    if not rows:
        return
    sets = ", ".join(f"{c} = {c} + %s" for c in columns)
    where = " AND ".join(f"{k} = %s" for k in keys)
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET {sets} WHERE {where}", rows)  # noqa: S608


def _write(groups: GroupRows, helped: dict[int, int], rounds: dict[int, int]) -> None:
    node_ids = set(groups.by_node) | set(helped) | set(rounds)
    existing = _existing_node_ids(node_ids)
    totals = []
    for node_id in sorted(node_ids & existing):
        m = groups.by_node.get(node_id, Measures())
        totals.append(
            (
                node_id,
                m.accepted,
                m.rejected,
                m.moderated,
                m.completions,
                m.reward,
                m.growth,
                helped.get(node_id, 0),
                rounds.get(node_id, 0),
            )
        )
    _upsert_add(
        "web_nodestats",
        ["node_id"],
        [
            "accepted_groups",
            "rejected_groups",
            "moderated_groups",
            "credited_completions",
            "verified_reward",
            "credit_growth",
            "helped",
            "rounds",
        ],
        totals,
    )
    hour_columns = ["accepted_groups", "rejected_groups", "credited_completions", "verified_reward"]
    _upsert_add(
        "web_nodehour",
        ["node_id", "hour"],
        hour_columns,
        [
            (n, h, m.accepted, m.rejected, m.completions, m.reward)
            for (n, h), m in sorted(groups.by_node_hour.items())
            if n in existing
        ],
    )
    _upsert_add(
        "web_datasethour",
        ["swarm_id", "hour", "dataset"],
        hour_columns,
        [
            (s, h, d, m.accepted, m.rejected, m.completions, m.reward)
            for (s, d, h), m in sorted(groups.by_dataset_hour.items())
        ],
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

    Connected to pool.signals.rollouts_moderation_changing (WebConfig.ready), which
    pool.services.rollout_set_moderation sends in its transaction just before the change: it reads the
    groups' current (old) status. Groups newer than the fold
    need nothing (readers compute them live). Returns how many folded groups changed credit.
    """
    queryset = rollouts if isinstance(rollouts, QuerySet) else Rollout.objects.filter(id__in=list(rollouts))
    credited_after = status not in MODERATED_OUT
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])  # no fold in between
    cursor_row = StatsCursor.objects.filter(id=1).first()
    if cursor_row is None:
        return 0
    changing = [
        r
        for r in queryset.filter(verdict="accepted", created_at__lt=cursor_row.folded_until).only(
            "id",
            "node_id",
            "swarm_id",
            "dataset",
            "created_at",
            "completion_count",
            "verified_rewards",
            "moderation_status",
        )
        if (r.moderation_status not in MODERATED_OUT) != credited_after
    ]
    sign = 1 if credited_after else -1
    half_life = CREDIT_HALF_LIFE.total_seconds()
    totals: dict[int, list] = {}
    node_hours: dict[tuple[int, datetime], list] = {}
    dataset_hours: dict[tuple[int, datetime, str], list] = {}
    for r in changing:
        reward = sum(float(x) for x in (r.verified_rewards or []))
        growth = reward * 2.0 ** ((r.created_at - CREDIT_EPOCH).total_seconds() / half_life)
        hour = r.created_at.replace(minute=0, second=0, microsecond=0)
        t = totals.setdefault(r.node_id, [0, 0, 0.0, 0.0])
        for key, bucket in (((r.node_id, hour), node_hours), ((r.swarm_id, hour, r.dataset), dataset_hours)):
            b = bucket.setdefault(key, [0, 0.0])
            b[0] += sign * r.completion_count
            b[1] += sign * reward
        t[0] -= sign  # moderated_groups moves the other way
        t[1] += sign * r.completion_count
        t[2] += sign * reward
        t[3] += sign * growth
    # Folded groups have their rows already: add to them in place.
    _update_add(
        "web_nodestats",
        ["node_id"],
        ["moderated_groups", "credited_completions", "verified_reward", "credit_growth"],
        [(*values, node_id) for node_id, values in sorted(totals.items())],
    )
    columns = ["credited_completions", "verified_reward"]
    _update_add("web_nodehour", ["node_id", "hour"], columns, [(*v, *key) for key, v in sorted(node_hours.items())])
    _update_add(
        "web_datasethour",
        ["swarm_id", "hour", "dataset"],
        columns,
        [(*v, *k) for k, v in sorted(dataset_hours.items())],
    )
    return len(changing)


def _follow_moderation(sender: object, *, rollouts: QuerySet[Rollout], status: str, **kwargs: object) -> None:
    node_stats_apply_moderation(rollouts=rollouts, status=status)


def follow_moderation() -> None:
    """Keep the folded figures in step with moderation (WebConfig.ready)."""
    rollouts_moderation_changing.connect(_follow_moderation, dispatch_uid="web.stats.follow_moderation")


@transaction.atomic
def stats_rebuild() -> None:
    """Forget every folded figure and fold the whole pool again (after a moderation sweep, or to
    recount from scratch). Takes the fold's lock for the whole transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        cursor.execute("DELETE FROM web_nodestats; DELETE FROM web_nodehour; DELETE FROM web_datasethour;")
    StatsCursor.objects.filter(id=1).delete()
    stats_fold()


# ---------------------------------------------------------------------------- reading


@dataclass
class Live:
    """What the fold has not counted yet, as of one snapshot."""

    cursor: StatsCursor | None
    groups: GroupRows
    helped: dict[int, int]
    rounds: dict[int, int]

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


def recent_average_credit(growth: float, *, now: datetime) -> float:
    """Verified reward per day, exponentially weighted with a CREDIT_HALF_LIFE half-life.

    growth = sum of reward * 2^((t - epoch)/H); the decayed sum at `now` is growth * 2^(-(now - epoch)/H);
    a steady r per day gives a decayed sum of r * H/ln 2 days, hence the factor ln 2 / H (in days).
    """
    if growth <= 0:
        return 0.0
    half_life_days = CREDIT_HALF_LIFE.total_seconds() / 86400
    exponent = -(now - CREDIT_EPOCH).total_seconds() / CREDIT_HALF_LIFE.total_seconds()
    return growth * (2.0**exponent) * LN2 / half_life_days
