"""A month of a large swarm, simulated: the pool filled server-side to tens of millions of groups, and
what the site does measured as it grows (docs/benchmarks.md, "A month").

    .venv/bin/python bench/month.py --groups 10000000 --steps 5 --requests 20  # the published run
    .venv/bin/python bench/month.py --quick                                  # 20k groups, 2 steps

The month is `--days` days ending now, written newest first in `--steps` slices: after the first step
the sampling window is full, and each later step adds older days, so the pool grows as a month's does
behind a window that stays the same. The groups are made by set-based INSERT ... SELECT statements in
the database (not through the socket), into the real tables with the rows a stored group has there:
its ledger row (pool_rollout; the id a UUIDv7 of its created_at, time-ordered as a range-partitioned
ledger wants), its texts (pool_rollouttext, in the day's partition, `--completions` completions of
about `--completion-chars` characters drawn from a bank of distinct texts, so they compress as text
does, not as a repeated string), its fingerprints (moderation_rolloutfingerprint, for accepted
groups), a node's verdict counts, its stored bytes per hour (pool_nodestoragehour), a round report
per node and round (pool_noderound, `--groups-per-round` groups a round) and a consumption per
sampleable group (pool_consumption, `--consumed`). `--nodes` nodes of `--contributors` accounts write
them into two swarms (4 in 5 to the default one); a tenth of the groups have no variance, one in fifty
is rejected, one in a thousand is held for review. `sample_seq` is dense per swarm and grows with
created_at, as the swarm's sequence gives it (the sequence is set past the month first). The filled
slice is then folded into the figures by the fold's own code (figures.stats), so the figure tables
grow with the pool too.

At each step (the empty pool first), with every node marked active:
- ingest: `--ingest-rounds` runs of 4 WebSocket clients sharing 8 messages of 32 groups to a daphne
  (bench/pool.py's clients and server: the real share path, verification and moderation rules on);
  groups/s, median of the runs, and its ratio to the empty pool's;
- sample: `--samples` calls of pool.sampling.rollout_sample (what the `sample` message runs), n=8;
- jobs: one run each of the scheduled fold (of the groups just ingested), badges, export (all files),
  and retention (keeping every filled day but at the last step, where the default retention ages out
  the days past SAPO_TEXT_RETENTION_DAYS: that run's time and the disk before and after are printed);
- pages: `--requests` GETs of the leaderboard page, its API and the swarm page through the same
  daphne (as served: the figures' 5 s cache on), and `--requests` renders in this process with the
  cache emptied before each (what the first visit after the cache expires waits);
- disk: the ledger, texts and the rest, tables and indexes apart, and the database.

Runs in its own database (`--db-name`, dropped at the end unless --keep-db) on DATABASE_URL's server.
The fill runs at nice 10 (this process and its PostgreSQL backend, when run as root: lowering a nice
value again needs it); the measures run at the priority the script was started with.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchkit import ROOT, free_port, load, pool_bench, use_checkout

use_checkout()
sys.path.insert(0, str(ROOT / "tests"))  # factories.make_swarm: a second swarm with its catalogue

#: The share path's clients at each measure (bench/pool.py's): connections x messages x groups.
INGEST_SHAPE = (4, 8, 32)
#: Distinct completion texts the groups draw theirs from.
BANK = 4_096
#: Groups per fill statement.
CHUNK = 100_000


def parse_args() -> Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_bench_month")
    parser.add_argument("--keep-db", action="store_true")
    parser.add_argument("--groups", type=int, default=10_000_000, help="groups in the month")
    parser.add_argument("--steps", type=int, default=5, help="slices the month is filled in (a row each)")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--contributors", type=int, default=250)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--completion-chars", type=int, default=700, help="mean characters of a completion")
    parser.add_argument("--groups-per-round", type=int, default=8, help="a round report per node every N groups")
    parser.add_argument("--consumed", type=float, default=1.0, help="consumptions per sampleable group (0 to 1)")
    parser.add_argument("--ingest-rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument(
        "--archive", default="", help="SAPO_ARCHIVE_DIR for the retention (default: none, dropped unarchived)"
    )
    parser.add_argument("--quick", action="store_true", help="20k groups, 2 steps, 40 nodes (a test)")
    args = parser.parse_args()
    if args.quick:
        args.groups, args.steps, args.nodes, args.contributors = 20_000, 2, 40, 10
        args.ingest_rounds, args.samples, args.requests = 1, 40, 8
    return args


# --- the fill ---------------------------------------------------------------------------------

#: A UUIDv7 (RFC 9562) whose timestamp is `ts`: its unix milliseconds in the first 48 bits over a random
#: UUID (variant 10 already), version nibble 7.
UUID7_SQL = """
CREATE OR REPLACE FUNCTION bench_uuid7(ts timestamptz) RETURNS uuid LANGUAGE sql VOLATILE AS $$
SELECT encode(set_byte(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send((extract(epoch FROM ts) * 1000)::bigint) FROM 3 FOR 6) FROM 1 FOR 6),
    6, (get_byte(uuid_send(gen_random_uuid()), 6) & 15) | 112), 'hex')::uuid
$$
"""

# One statement per chunk of the month's groups g in [lo, hi), g = 0 the newest. Per swarm, the groups
# take positions j (the default swarm 4 in 5, the other 1 in 5); within a swarm position j is
# sampleable unless j % 10 >= 8 (no variance; rejected when j % 50 = 9, held when j % 1000 = 8), so the
# sampleable ones before position j are 8 * (j / 10) + least(j % 10, 8), and sample_seq (dense,
# growing with created_at) is the swarm's total less those at or before j, plus 1.
FILL_SQL = """
WITH src AS (
    SELECT g, node_ids[1 + g %% cardinality(node_ids)] AS node, g / cardinality(node_ids) AS nth,
           CASE WHEN g %% 5 = 4 THEN 1 ELSE 0 END AS other,
           CASE WHEN g %% 5 = 4 THEN g / 5 ELSE 4 * (g / 5) + g %% 5 END AS j,
           %(t0)s::timestamptz - make_interval(secs => (g + 0.5) * %(spacing)s) AS at
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g, (SELECT %(nodes)s::bigint[] AS node_ids) n
), rows AS (
    SELECT s.*, bench_uuid7(s.at) AS id, 1 + s.g %% 997 AS bank,
           (j %% 10 < 8) AS variance, (j %% 50 = 9) AS rejected, (j %% 1000 = 8) AS held,
           (ARRAY[%(total0)s, %(total1)s]::bigint[])[1 + other] - (8 * ((j + 1) / 10) + least((j + 1) %% 10, 8)) + 1 AS seq
    FROM src s
), ledger AS (
    INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
        completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
        has_variance, sampleable, sample_seq, created_at)
    SELECT id, node, (ARRAY[%(swarm0)s, %(swarm1)s]::bigint[])[1 + other], 1, nth / %(per_round)s,
           (ARRAY['basic_arithmetic', 'chain_sum', 'leg_counting', 'propositional_logic', 'word_sorting'])[1 + g %% 5],
           node * 1000003 + nth / 512, nth %% 512, %(completions)s,
           (SELECT claimed FROM bench_rewards WHERE variance = r.variance),
           (SELECT claimed FROM bench_rewards WHERE variance = r.variance),
           CASE WHEN rejected THEN 'rejected' ELSE 'accepted' END,
           CASE WHEN rejected THEN 'reward_mismatch' ELSE '' END,
           CASE WHEN held THEN 'held' ELSE 'ok' END,
           variance, variance, CASE WHEN variance THEN seq END, at
    FROM rows r
    RETURNING id, node_id, swarm_id, created_at, verdict, sampleable, round
), texts AS (
    INSERT INTO pool_rollouttext (rollout_id, swarm_id, created_at, question, answer, completions)
    SELECT r.id, l.swarm_id, r.at, b.question || ' #' || r.g, b.answer, b.completions
    FROM rows r JOIN ledger l ON l.id = r.id JOIN bench_texts b ON b.id = r.bank
), prints AS (
    INSERT INTO moderation_rolloutfingerprint (rollout_id, node_id, question_hash, exact, simhash, created_at)
    SELECT l.id, l.node_id, md5(l.id::text) || left(md5(l.node_id::text), 8),
           decode(repeat(md5(l.id::text || 'e'), %(completions)s), 'hex'),
           decode(repeat(left(md5(l.id::text || 's'), 16), %(completions)s), 'hex'), l.created_at
    FROM ledger l WHERE l.verdict = 'accepted'
), used AS (
    INSERT INTO pool_consumption (consumer_id, rollout_id, author_id, swarm_id, round, created_at)
    SELECT node_ids[1 + (r.g + 7) %% cardinality(node_ids)], l.id, l.node_id, l.swarm_id, l.round,
           l.created_at + interval '5 minutes'
    FROM ledger l JOIN rows r ON r.id = l.id, (SELECT %(nodes)s::bigint[] AS node_ids) n
    WHERE l.sampleable AND r.g %% 1000 < %(consumed)s
), reports AS (
    INSERT INTO pool_noderound (node_id, swarm_id, round, figures, used_count, created_at, updated_at)
    SELECT r.node, l.swarm_id, l.round,
           jsonb_build_object('reward_mean', 0.5, 'reward_std', 0.25, 'groups_local', %(per_round)s,
                              'groups_pool', 8, 'loss', 1.25),
           8, l.created_at, l.created_at
    FROM ledger l JOIN rows r ON r.id = l.id
    WHERE r.nth %% %(per_round)s = 0
    ON CONFLICT (node_id, round) DO NOTHING
)
INSERT INTO pool_nodeverdictcounts AS t (node_id, accepted_groups, rejected_groups, updated_at)
SELECT node_id, count(*) FILTER (WHERE verdict = 'accepted'), count(*) FILTER (WHERE verdict <> 'accepted'), now()
FROM ledger GROUP BY node_id
ON CONFLICT (node_id) DO UPDATE SET accepted_groups = t.accepted_groups + EXCLUDED.accepted_groups,
    rejected_groups = t.rejected_groups + EXCLUDED.rejected_groups, updated_at = now()
"""

#: Each node's stored bytes per hour over a slice (what the storage budgets read), as ingest counts them.
STORAGE_SQL = """
INSERT INTO pool_nodestoragehour (node_id, hour, bytes)
SELECT node, hour, %(bytes)s::bigint
FROM unnest(%(nodes)s::bigint[]) AS node,
     generate_series(date_trunc('hour', %(lo)s::timestamptz), %(hi)s::timestamptz, interval '1 hour') AS hour
ON CONFLICT (node_id, hour) DO NOTHING
"""


def sampleable_before(j: int) -> int:
    """Sampleable positions among a swarm's first j (FILL_SQL's pattern)."""
    return 8 * (j // 10) + min(j % 10, 8)


def swarm_totals(groups: int) -> tuple[int, int]:
    """Sampleable groups of each swarm over the month (FILL_SQL: g % 5 = 4 is the other swarm's)."""
    other = groups // 5
    return sampleable_before(groups - other), sampleable_before(other)


def make_bank(args: Namespace) -> None:
    """The texts the groups draw from: distinct reasoning of about --completion-chars characters, each a
    different draw of words and numbers (as compressible as such text is), 997 ready-made groups."""
    from django.db import connection

    words_of = pool_bench().REASONING_WORDS
    rng = random.Random(7)

    def completion() -> str:
        size = max(40, int(rng.gauss(args.completion_chars, args.completion_chars / 4)))
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < size - 30:
            words.append(rng.choice(words_of) if rng.random() < 0.8 else str(rng.randint(0, 99999)))
        return " ".join(words) + f" <answer>{rng.randint(0, 999)}</answer>"

    import json

    rows = [
        (
            i,
            f"What is {rng.randint(10, 9999)} + {rng.randint(10, 9999)}? Give the answer in <answer> tags.",
            str(rng.randint(0, 999)),
            json.dumps([completion() for _ in range(args.completions)]),
        )
        for i in range(1, 998)
    ]
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE bench_texts (id int PRIMARY KEY, question text, answer text, completions jsonb)")
        cur.executemany("INSERT INTO bench_texts VALUES (%s, %s, %s, %s)", rows)
        cur.execute("CREATE TABLE bench_rewards (variance bool PRIMARY KEY, claimed jsonb)")
        half = [1 if k % 2 == 0 else 0 for k in range(args.completions)]
        cur.execute(
            "INSERT INTO bench_rewards VALUES (true, %s), (false, %s)",
            [json.dumps(half), json.dumps([0] * args.completions)],
        )
        cur.execute(UUID7_SQL)


def fill_slice(args: Namespace, world: dict, lo: int, hi: int) -> None:
    """Groups g in [lo, hi) of the month, in chunks, each chunk one transaction."""
    from django.db import connection, transaction

    spacing = args.days * 86_400 / args.groups
    for start in range(lo, hi, CHUNK):
        stop = min(hi, start + CHUNK)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                FILL_SQL,
                {
                    "lo": start,
                    "hi": stop,
                    "t0": world["t0"],
                    "spacing": spacing,
                    "nodes": world["nodes"],
                    "swarm0": world["swarms"][0].id,
                    "swarm1": world["swarms"][1].id,
                    "total0": world["totals"][0],
                    "total1": world["totals"][1],
                    "per_round": args.groups_per_round,
                    "completions": args.completions,
                    "consumed": int(args.consumed * 1000),
                },
            )
    newest, oldest = world["t0"] - timedelta(seconds=lo * spacing), world["t0"] - timedelta(seconds=hi * spacing)
    per_node_hour = (args.groups / args.nodes) / (args.days * 24)
    with connection.cursor() as cur:
        cur.execute(
            STORAGE_SQL,
            {"nodes": world["nodes"], "lo": oldest, "hi": newest, "bytes": int(per_node_hour * world["group_bytes"])},
        )


def catch_up_fold(start: datetime, end: datetime) -> None:
    """Fold a filled slice (created before the fold's cursor) into the figures with the fold's own code:
    its groups' rows, and the consumptions and round reports after the cursor's ids (then past them)."""
    from django.db import transaction
    from django.utils import timezone

    from figures import stats
    from figures.models import StatsCursor

    with transaction.atomic():
        cursor = StatsCursor.objects.select_for_update().get(id=1)
        groups = stats._group_rows(start=start, end=end, node_ids=None)
        now = timezone.now()
        consumption_to = stats._last_id_before("pool_consumption", after_id=cursor.consumption_id, cutoff=now)
        round_to = stats._last_id_before("pool_noderound", after_id=cursor.round_id, cutoff=now)
        helped = stats._counts_by(
            "pool_consumption", "author_id", after_id=cursor.consumption_id, up_to_id=consumption_to
        )
        rounds = stats._counts_by("pool_noderound", "node_id", after_id=cursor.round_id, up_to_id=round_to)
        stats._write(groups, helped, rounds)
        StatsCursor.objects.filter(id=1).update(consumption_id=consumption_to, round_id=round_to)


# --- the measures -----------------------------------------------------------------------------


def percentiles(ms: list[float]) -> tuple[float, float]:
    ts = sorted(ms)
    return statistics.median(ts), ts[min(len(ts) - 1, int(len(ts) * 0.99))]


def measure_ingest(args: Namespace, world: dict, step: int) -> tuple[float, float]:
    """Groups/s through the share path into the month's pool, and its ratio to the first day's copy:
    --ingest-rounds rounds of bench/pool.py's clients, each round sharing to both servers in turn (which
    goes first alternates), the ratio taken within each round; medians."""
    pb = pool_bench()
    connections, messages, groups = INGEST_SHAPE
    shape = Namespace(
        connections=connections,
        messages=messages,
        groups=groups,
        completions=args.completions,
        completion_chars=args.completion_chars,
        catalogue="easy",
    )
    rates, ratios = [], []
    for r in range(args.ingest_rounds):
        got = {}
        for target in ("month", "first") if r % 2 == 0 else ("first", "month"):
            seeds = [1_000_000 * (step + 1) + 1000 * r + 100 * (target == "first") + c for c in range(connections)]
            frames = pb.build_frames(shape, seeds)
            elapsed, _ = asyncio.run(
                pb.run_clients([world["ports"][target]], world["tokens"], frames, args.completions)
            )
            got[target] = connections * messages * groups / elapsed
        rates.append(got["month"])
        ratios.append(got["month"] / got["first"])
    world["ingested_until"] = datetime.now(UTC)
    return statistics.median(rates), statistics.median(ratios)


def measure_sample(args: Namespace, world: dict) -> tuple[float, float, float]:
    """rollout_sample's p50 and p99 on the month's pool, and its p99's ratio to the first day's copy's:
    the calls alternate between the two databases."""
    from django.db import connections

    from pool.limits import current_limits
    from pool.sampling import rollout_sample

    window = current_limits().sample_window_seconds
    asker, swarm = world["asker"], world["swarms"][0].id
    default = connections["default"]
    times: dict[str, list[float]] = {"month": [], "first": []}
    got = 0
    try:
        for i in range(10 + args.samples):
            for target in ("month", "first") if i % 2 == 0 else ("first", "month"):
                connections["default"] = default if target == "month" else connections["first"]
                t0 = time.perf_counter()
                drawn = rollout_sample(node=asker, n=8, window_seconds=window, swarm_id=swarm)
                if i >= 10:  # the first calls warm the caches and connections
                    times[target].append((time.perf_counter() - t0) * 1000)
                    got += len(drawn.texts)
    finally:
        connections["default"] = default
    if got < 2 * 7 * args.samples:
        raise SystemExit(f"sampling drew {got} groups in {2 * args.samples} calls of 8")
    p50, p99 = percentiles(times["month"])
    return p50, p99, p99 / percentiles(times["first"])[1]


def timed(function, *a, **kw) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    function(*a, **kw)
    return time.perf_counter() - t0


def measure_jobs(args: Namespace, world: dict, last: bool) -> dict[str, float]:
    """One run of each scheduled job. The fold folds the groups just ingested; retention keeps every
    filled day but at the last step."""
    from django.db.models import Count, Sum
    from django.test import override_settings
    from django.utils import timezone

    from figures.badges import badges_assign_job
    from figures.export import stats_export
    from figures.stats import FOLD_LAG, stats_fold
    from pool.models import RetentionDay
    from pool.retention import retention_job

    out = {"fold": timed(stats_fold, now=max(timezone.now(), world["ingested_until"]) + FOLD_LAG)}
    out["badges"] = timed(badges_assign_job)
    out["export"] = timed(stats_export, directory=world["export_dir"])
    keep = settings_days(args, last)
    # Without --archive the days are dropped unarchived, as a site that allows it (the drop is what is timed).
    unarchived = "keep" if args.archive else "drop"
    with override_settings(
        SAPO_TEXT_RETENTION_DAYS=keep, SAPO_ARCHIVE_DIR=args.archive, SAPO_RETENTION_UNARCHIVED=unarchived
    ):
        if last:
            world["disk_before_retention"] = disk()
        t0 = time.perf_counter()
        retention_job()
        out["retention"] = time.perf_counter() - t0
        world["retention"] = RetentionDay.objects.filter(dropped_at__isnull=False).aggregate(
            days=Count("day"), groups=Sum("groups"), kept=Sum("kept")
        )
    return out


def settings_days(args: Namespace, last: bool) -> int:
    from django.conf import settings

    return settings.SAPO_TEXT_RETENTION_DAYS if last else args.days + 2


PAGES = (("leaderboard page", "/leaderboard/"), ("leaderboard API", "/api/v1/leaderboard/"), ("swarm page", None))


def page_paths(world: dict) -> list[tuple[str, str]]:
    return [(name, path or f"/swarms/{world['swarms'][0].slug}/") for name, path in PAGES]


def measure_pages(args: Namespace, world: dict) -> dict[str, tuple[float, float, float, float]]:
    """Per page: served p50, p99 (HTTP to the daphne, keep-alive), uncached p50, p99 (rendered here with
    the cache emptied before each, the lazy fold's due mark set so that it does not run)."""
    from django.core.cache import cache
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    out = {}
    for name, path in page_paths(world):
        served, cold = [], []
        conn = http.client.HTTPConnection("127.0.0.1", world["ports"]["month"], timeout=120)
        for _ in range(args.requests):
            t0 = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            served.append((time.perf_counter() - t0) * 1000)
            if response.status != 200:
                raise SystemExit(f"GET {path}: {response.status}")
        conn.close()
        for _ in range(args.requests):
            cache.clear()
            cache.add("web:stats:fold-due", 1, 60)
            t0 = time.perf_counter()
            response = client.get(path)
            cold.append((time.perf_counter() - t0) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"GET {path} (in process): {response.status_code}")
        out[name] = (*percentiles(served), *percentiles(cold))
    return out


#: A table's leaves when it is partitioned, itself when not (a partitioned parent and its indexes hold no
#: bytes of their own).
DISK_SQL = """
SELECT coalesce(sum(pg_table_size(r)), 0), coalesce(sum(pg_indexes_size(r)), 0)
FROM (SELECT relid AS r FROM pg_partition_tree(%(t)s::regclass) WHERE isleaf UNION SELECT %(t)s::regclass) AS t
"""
OTHER_TABLES = (
    "moderation_rolloutfingerprint",
    "pool_consumption",
    "pool_noderound",
    "pool_nodestoragehour",
    "pool_servedgroup",
    "figures_nodehour",
    "figures_nodeswarmhour",
    "figures_datasethour",
)


def disk() -> dict[str, int]:
    """Bytes of the ledger, the texts and what grows beside them (tables and indexes apart), and the
    database's."""
    from django.db import connection

    out = {}
    with connection.cursor() as cur:
        for name in ("pool_rollout", "pool_rollouttext", *OTHER_TABLES):
            cur.execute(DISK_SQL, {"t": name})
            out[name], out[name + ".idx"] = (int(v) for v in cur.fetchone())
        cur.execute("SELECT pg_database_size(current_database())")
        out["database"] = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM pool_rollout")
        out["groups"] = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM pool_rollouttext")
        out["texts"] = cur.fetchone()[0]
    return out


def gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def other(d: dict[str, int]) -> int:
    return sum(d[t] + d[t + ".idx"] for t in OTHER_TABLES)


# --- the run ----------------------------------------------------------------------------------


@contextmanager
def niced() -> Iterator[None]:
    """This process and its PostgreSQL backend at nice 10 (the fill), back to their own after (the
    measures). Lowering a nice value again needs root (or CAP_SYS_NICE); without it the fill is not niced."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    pids = [0, backend]
    try:
        before = [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids]
    except OSError:  # the database on another machine
        pids, before = [0], [os.getpriority(os.PRIO_PROCESS, 0)]
    root = os.geteuid() == 0
    try:
        if root:
            for pid in pids:
                os.setpriority(os.PRIO_PROCESS, pid, 10)
        yield
    finally:
        if root:
            for pid, value in zip(pids, before, strict=True):
                os.setpriority(os.PRIO_PROCESS, pid, value)


def analyze() -> None:
    """What autovacuum's analyze would have done after a day of inserts: the planner's statistics."""
    from django.db import connection

    with connection.cursor() as cur:
        for table in ("pool_rollout", "pool_rollouttext", "moderation_rolloutfingerprint", "pool_consumption"):
            cur.execute(f"ANALYZE {table}")


def setup(args: Namespace) -> dict:
    from django.db import connection
    from django.utils import timezone
    from factories import make_swarm

    from accounts.services import user_create
    from figures.stats import FOLD_LAG, stats_fold
    from nodes.models import Node
    from nodes.services import node_create
    from pool.retention import ledger_partitions_ensure, partitions_ensure
    from swarms.services import swarm_default_ensure

    pb = pool_bench()
    owners = [
        user_create(username=f"c{i}", display_name=f"Contributor {i}", password=None) for i in range(args.contributors)
    ]
    nodes = [node_create(owner=owners[i % len(owners)], name=f"n{i}") for i in range(args.nodes)]
    ingest = pb.make_nodes(INGEST_SHAPE[0], "ingest")
    swarms = [swarm_default_ensure(), make_swarm(slug="second")]
    now = timezone.now()
    t0 = now - timedelta(minutes=10)  # the newest filled group: before the ingest's, after the fold's cursor
    partitions_ensure(now=t0 - timedelta(days=args.days + 1), ahead=args.days + 2)
    # The ledger's months from the oldest filled day's: its ids are UUIDv7s of their days, and a month
    # not made would leave them in the DEFAULT partition.
    ledger_partitions_ensure(since=(t0 - timedelta(days=args.days + 1)).date())
    make_bank(args)
    with connection.cursor() as cur:
        cur.execute("SELECT avg(octet_length(question) + octet_length(completions::text)) FROM bench_texts")
        group_bytes = float(cur.fetchone()[0]) + 400  # as pool.budgets counts a group, near enough
        totals = swarm_totals(args.groups)
        for swarm, total in zip(swarms, totals, strict=True):  # the month's numbers are taken
            if total:
                cur.execute("SELECT setval(%s::regclass, %s)", [swarm.sample_sequence, total])
    Node.objects.update(last_seen_at=now)
    # The fold's cursor at the newest filled group: the filled slices are folded by catch_up_fold, the
    # groups shared through the socket (after t0) by the scheduled fold.
    stats_fold(now=t0 + FOLD_LAG)
    export_dir = Path(tempfile.mkdtemp(prefix="sapo-month-export-"))
    return {
        "t0": t0,
        "nodes": [n.id for n in nodes],
        "asker": nodes[0],
        "tokens": [t for _, t in ingest],
        "swarms": swarms,
        "totals": totals,
        "group_bytes": group_bytes,
        "export_dir": export_dir,
    }


def measure_step(args: Namespace, world: dict, step: int, last: bool) -> dict:
    from django.db import connection
    from django.utils import timezone

    from nodes.models import Node

    Node.objects.update(last_seen_at=timezone.now())  # a large swarm: every node active
    connection.close()
    row: dict = {"load_start": load()}
    row["ingest"] = measure_ingest(args, world, step)
    row["sample"] = measure_sample(args, world)
    row["jobs"] = measure_jobs(args, world, last)
    row["pages"] = measure_pages(args, world)
    row["disk"] = disk()
    row["load_end"] = load()
    return row


def print_table(args: Namespace, rows: list[dict]) -> None:
    print(
        f"\nA month: {args.groups:,} groups over {args.days} days, {args.nodes:,} nodes of {args.contributors:,}"
        f" contributors, 2 swarms, {args.completions} completions of ~{args.completion_chars} chars;"
        f" {os.cpu_count()} CPUs"
    )
    print(
        "| groups | ledger GB (idx) | texts GB (idx) | other GB | database GB | ingest groups/s (/first day)"
        " | sample p50/p99 ms (p99 /first day) | fold s | badges s | export s | retention s"
        " | leaderboard page ms | leaderboard API ms | swarm page ms | load start-end |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|")
    for r in rows:
        d, j, p = r["disk"], r["jobs"], r["pages"]
        pages = " | ".join(
            f"{p[name][0]:.0f}/{p[name][1]:.0f} (uncached {p[name][2]:.0f}/{p[name][3]:.0f})" for name, _ in PAGES
        )
        print(
            f"| {r['groups']:,} | {gb(d['pool_rollout'])} ({gb(d['pool_rollout.idx'])})"
            f" | {gb(d['pool_rollouttext'])} ({gb(d['pool_rollouttext.idx'])}) | {gb(other(d))} | {gb(d['database'])}"
            f" | {r['ingest'][0]:,.0f} ({r['ingest'][1]:.2f}) | {r['sample'][0]:.1f}/{r['sample'][1]:.1f}"
            f" ({r['sample'][2]:.2f}) | {j['fold']:.2f} | {j['badges']:.2f} | {j['export']:.2f}"
            f" | {j['retention']:.2f} | {pages} | {r['load_start']}-{r['load_end']} |"
        )
    print("(pages: p50/p99 served through daphne, its 5 s figures cache on; uncached: rendered with the cache emptied)")


def print_fill(fills: list[dict]) -> None:
    print("\nfill: | groups added | fill s | groups/s | fold of the slice s | load |\n|---:|---:|---:|---:|---|")
    for f in fills:
        print(f"| {f['added']:,} | {f['fill']:.0f} | {f['added'] / f['fill']:,.0f} | {f['fold']:.1f} | {f['load']} |")


def print_storage(args: Namespace, world: dict, rows: list[dict]) -> None:
    before, after = world["disk_before_retention"], rows[-1]["disk"]
    groups, texts = before["groups"], before["texts"]

    def per(d: dict, table: str, n: int) -> str:
        return f"{d[table] / n:,.0f} + {d[table + '.idx'] / n:,.0f}"

    print(f"\nstorage at the month's size ({groups:,} groups), bytes per group (table + indexes):")
    print(f"- ledger (pool_rollout): {per(before, 'pool_rollout', groups)}")
    print(f"- texts (pool_rollouttext): {per(before, 'pool_rollouttext', texts)}")
    for table in OTHER_TABLES:
        print(f"- {table}: {per(before, table, groups)}")
    print(f"- database: {before['database'] / groups:,.0f}")
    print(
        f"retention: {world['retention']['days']} days aged out, {world['retention']['groups']:,} groups' texts"
        f" ({world['retention']['kept']} kept under review); texts {gb(before['pool_rollouttext'] + before['pool_rollouttext.idx'])}"
        f" -> {gb(after['pool_rollouttext'] + after['pool_rollouttext.idx'])} GB, database {gb(before['database'])}"
        f" -> {gb(after['database'])} GB, in {rows[-1]['jobs']['retention']:.1f} s"
    )


def first_day_copy(args: Namespace, world: dict, servers: dict) -> None:
    """The database as it is after the first day's fill, copied (CREATE DATABASE ... TEMPLATE) for the
    run's baseline, with a daphne of its own, and the `first` alias on it (sampling). No session may be
    on the database while it is copied: the month's server stops meanwhile."""
    from django.conf import settings
    from django.db import connections

    pb = pool_bench()
    for server in servers.values():
        server.terminate()
        server.wait(timeout=20)
    connections.close_all()
    connections["default"].close_pool()
    pb.recreate_database(args.database_url, args.first_db, template=args.db_name)
    first = Namespace(**{**vars(args), "bench_url": pb.with_db(args.database_url, args.first_db)})
    settings.DATABASES["first"] = {**settings.DATABASES["default"], "NAME": args.first_db}
    world["ports"] = {"month": free_port(), "first": free_port()}
    servers["month"] = pb.start_server(args, world["ports"]["month"], True, name="month")
    servers["first"] = pb.start_server(first, world["ports"]["first"], True, name="first")


def main() -> None:
    args = parse_args()
    pb = pool_bench()
    args.bench_url = pb.with_db(args.database_url, args.db_name)
    args.first_db = f"{args.db_name}_first"
    args.catalogue, args.conn_max_age = "easy", 600
    pb.recreate_database(args.database_url, args.db_name)
    os.environ["SAPO_REDIS_PREFIX"] = f"sapomonth{os.getpid()}"
    os.environ["SAPO_DEBUG"] = "0"  # no statement log kept in this process's connections
    servers: dict = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the servers and databases go too
    print(f"load average at start {load()}", flush=True)
    try:
        pb.setup_django(args)
        world = setup(args)
        rows, fills = [], []
        # The first slice is the newest day (the sampling window's, nothing older): a copy of the pool
        # then is the baseline every later row is compared with, in alternation. The rest of the month
        # follows in --steps slices.
        day = args.groups // args.days
        bounds = [0, day, *(day + round((args.groups - day) * k / args.steps) for k in range(1, args.steps + 1))]
        spacing = args.days * 86_400 / args.groups
        for step in range(1, len(bounds)):
            lo, hi = bounds[step - 1], bounds[step]
            with niced():
                t0 = time.perf_counter()
                fill_slice(args, world, lo, hi)
                fill = time.perf_counter() - t0
                t0 = time.perf_counter()
                catch_up_fold(
                    world["t0"] - timedelta(seconds=hi * spacing), world["t0"] - timedelta(seconds=lo * spacing)
                )
                analyze()
            fills.append({"added": hi - lo, "fill": fill, "fold": time.perf_counter() - t0, "load": load()})
            print(f"filled {hi:,} groups in {fill:.0f} s (load {load()})", flush=True)
            if step == 1:
                first_day_copy(args, world, servers)
            row = measure_step(args, world, step, last=step == len(bounds) - 1)
            row["groups"] = row["disk"]["groups"]
            rows.append(row)
            print(f"measured at {row['groups']:,} groups (load {row['load_end']})", flush=True)
        print_table(args, rows)
        print_fill(fills)
        print_storage(args, world, rows)
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=20)
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            for name in (args.db_name, args.first_db):
                pb.recreate_database(args.database_url, name, drop_only=True)
    print(f"\nload average at end {load()}")


if __name__ == "__main__":
    main()
