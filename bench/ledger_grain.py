"""What the ledger's partition grain costs a statement without an id bound (a node's groups of the last
week, as the figures read them): planning time with a year of partitions by month (12), week (52) and
day (365), each with the ledger's four secondary indexes and a DEFAULT partition, in alternation.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/ledger_grain.py

Makes a scratch database `ledger_grain` on the server (dropped at the end); prints the planning p50 of
each grain and the load average.
"""

import os
import statistics
import sys
from datetime import UTC, datetime, timedelta

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "node_client"))
from sapo_node.ids import uuid7_floor  # noqa: E402

SERVER = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres").rsplit("/", 1)[0]
conn = psycopg.connect(f"{SERVER}/postgres", autocommit=True)
conn.execute("DROP DATABASE IF EXISTS ledger_grain")
conn.execute("CREATE DATABASE ledger_grain")
db = psycopg.connect(f"{SERVER}/ledger_grain", autocommit=True)
start = datetime(2026, 1, 1, tzinfo=UTC)
for grain, n, step in (("month", 12, None), ("week", 52, timedelta(days=7)), ("day", 365, timedelta(days=1))):
    t = f"l_{grain}"
    db.execute(
        f"CREATE TABLE {t} (id uuid PRIMARY KEY, node_id bigint, swarm_id bigint, sample_seq bigint, created_at timestamptz, sampleable bool, moderation_status text) PARTITION BY RANGE (id)"
    )
    for idx in (
        "(node_id, created_at DESC)",
        "(swarm_id, sample_seq) WHERE sampleable",
        "(swarm_id, created_at) WHERE sampleable",
        "(created_at) WHERE moderation_status IN ('held','quarantined')",
    ):
        db.execute(f"CREATE INDEX ON {t} {idx}")
    db.execute(f"CREATE TABLE {t}_default PARTITION OF {t} DEFAULT")
    for k in range(n):
        if grain == "month":
            lo = datetime(2026, k + 1, 1, tzinfo=UTC)
            hi = datetime(2026 + (k + 1) // 12, (k + 1) % 12 + 1, 1, tzinfo=UTC)
        else:
            lo = start + k * step
            hi = lo + step
        db.execute(
            f"CREATE TABLE {t}_{k} PARTITION OF {t} FOR VALUES FROM ('{uuid7_floor(lo)}') TO ('{uuid7_floor(hi)}')"
        )
    db.execute(f"ANALYZE {t}")
res = {}
for _round in range(3):  # the grains in alternation
    for grain in ("month", "week", "day"):
        t = f"l_{grain}"
        ps = []
        for _ in range(30):
            cur = db.execute(
                f"EXPLAIN (ANALYZE, SUMMARY ON) SELECT count(*) FROM {t} WHERE node_id = 1 AND created_at >= now() - interval '7 days'"
            )
            rows = [r[0] for r in cur.fetchall()]
            ps.append(float([r for r in rows if r.startswith("Planning Time")][0].split()[2]))
        res.setdefault(grain, []).extend(ps)
for grain, ps in res.items():
    print(f"{grain}: planning p50 {statistics.median(ps):.2f} ms (a node's query, no id bound)")
print("load", os.getloadavg())
db.close()
conn.execute("DROP DATABASE ledger_grain WITH (FORCE)")
