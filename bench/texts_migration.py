"""How long the pool's storage migrations take on a filled pool: pool 0008 (a group's texts into
pool_rollouttext, partitioned by day; docs/deploy.md, "Text retention and archives") and, with
--ledger, pool 0011 (the ledger pool_rollout partitioned by id; docs/deploy.md, "The ledger's
partitions").

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/texts_migration.py 1000000
    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/texts_migration.py --ledger 1000000

Makes a scratch database on DATABASE_URL's server (dropped at the end), migrates it, goes back to pool
0007, fills N groups of 8 completions of ~300 characters spread over N * 30 seconds, and times the
migration to 0008. With --ledger: goes back to pool 0010, fills N ledger rows with UUIDv4 ids (a pool
from before UUIDv7 ids) spread over N * 30 seconds and a consumption for one in ten (a foreign key the
migration makes again), and times the migration to 0011. Prints the time, per million groups, and
the load average.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FILL = """
INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
    question, answer, completions, completion_count, claimed_rewards, verified_rewards, verdict,
    reason, moderation_status, has_variance, sampleable, sample_seq, created_at)
SELECT gen_random_uuid(), %(node)s, %(swarm)s, 1, 1, 'basic_arithmetic', 1, g,
       'What is ' || g || ' + 17? Give the answer in <answer> tags.', (g + 17)::text,
       (SELECT jsonb_agg(%(words)s || ' (' || k || g || ') <answer>' || (g + k) || '</answer>')
        FROM generate_series(1, 8) k),
       8, '[1,0,1,0,1,0,1,0]', '[1,0,1,0,1,0,1,0]', 'accepted', '', 'ok', true, true, g,
       now() - make_interval(secs => g * 30)
FROM generate_series(1, %(n)s) AS g
"""


_LEDGER_FILL = """
INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, created_at)
SELECT gen_random_uuid(), %(node)s, %(swarm)s, 1, 1, 'basic_arithmetic', 1, g,
       8, '[1,0,1,0,1,0,1,0]', '[1,0,1,0,1,0,1,0]', 'accepted', '', 'ok', true, true, g,
       now() - make_interval(secs => g * 30)
FROM generate_series(1, %(n)s) AS g;
INSERT INTO pool_consumption (consumer_id, rollout_id, author_id, swarm_id, round, created_at)
SELECT %(node)s, id, node_id, swarm_id, 1, created_at FROM pool_rollout WHERE index %% 10 = 0;
"""


def main() -> None:
    ledger = "--ledger" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--ledger"]
    n = int(args[0]) if args else 100_000
    server = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres").rsplit("/", 1)[0]
    name = f"texts_migration_{os.getpid()}"
    subprocess.run(["createdb", "--maintenance-db", f"{server}/postgres", name], check=True)
    os.environ["DATABASE_URL"] = f"{server}/{name}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path[:0] = [os.path.join(ROOT, "platform"), os.path.join(ROOT, "tests")]
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    try:
        call_command("migrate", verbosity=0)
        from factories import make_node

        from swarms.services import swarm_default_ensure

        node, swarm = make_node(), swarm_default_ensure()
        if ledger:
            ledger_migration(n, node, swarm)
            return
        call_command("migrate", "pool", "0007", verbosity=0)
        words = " ".join(f"step {i} carries the digit and checks the partial sum again" for i in range(5))
        with connection.cursor() as cursor:
            cursor.execute(_FILL, {"node": node.id, "swarm": swarm.id, "n": n, "words": words})
            cursor.execute("VACUUM ANALYZE pool_rollout")
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pool_rollout'))")
            print(f"filled: {n:,} groups, pool_rollout {cursor.fetchone()[0]}", flush=True)
        load = os.getloadavg()
        started = time.perf_counter()
        call_command("migrate", "pool", "0008", verbosity=0)
        took = time.perf_counter() - started
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*), pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits"
                " WHERE inhparent = 'pool_rollouttext'::regclass"
            )
            partitions, size = cursor.fetchone()
            cursor.execute("VACUUM FULL pool_rollout")  # the dropped columns' space back, to size the ledger
            cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pool_rollout'))")
            ledger = cursor.fetchone()[0]
        print(
            f"migration 0008: {took:.1f} s for {n:,} groups ({took / n * 1e6:.0f} s per million), {partitions}"
            f" partitions, {size} of texts, {ledger} of ledger (after VACUUM FULL); load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
        )
    finally:
        connections.close_all()
        subprocess.run(["dropdb", "--force", "--maintenance-db", f"{server}/postgres", name], check=True)


def ledger_migration(n: int, node, swarm) -> None:  # noqa: ANN001
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", "pool", "0010", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute(_LEDGER_FILL, {"node": node.id, "swarm": swarm.id, "n": n})
        cursor.execute("VACUUM ANALYZE pool_rollout")
        cursor.execute("VACUUM ANALYZE pool_consumption")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pool_rollout'))")
        print(f"filled: {n:,} groups, pool_rollout {cursor.fetchone()[0]}, {n // 10:,} consumptions", flush=True)
    load = os.getloadavg()
    started = time.perf_counter()
    call_command("migrate", "pool", "0011", verbosity=0)
    took = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits"
            " WHERE inhparent = 'pool_rollout'::regclass"
        )
        partitions, size = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM pool_rollout")
        assert cursor.fetchone()[0] == n
    print(
        f"migration 0011: {took:.1f} s for {n:,} groups ({took / n * 1e6:.0f} s per million), {partitions}"
        f" partitions, {size} of ledger; load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )


if __name__ == "__main__":
    main()
