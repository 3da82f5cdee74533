"""How long migration pool 0008 (a group's texts into pool_rollouttext, partitioned by day) takes on a
filled pool (docs/deploy.md, "Text retention and archives").

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/texts_migration.py 1000000

Makes a scratch database on DATABASE_URL's server (dropped at the end), migrates it, goes back to pool
0007, fills N groups of 8 completions of ~300 characters spread over N * 30 seconds, and times the
migration to 0008. Prints the time, per million groups, and the load average.
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


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
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


if __name__ == "__main__":
    main()
