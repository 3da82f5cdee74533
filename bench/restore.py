"""A backup restored under running nodes: is every acknowledged group back? (docs/deploy.md, "Backups
and restore").

    .venv/bin/python bench/restore.py                  # 4 nodes
    .venv/bin/python bench/restore.py --nodes 2 --before 3 --after 6   # tests/integration/test_backup_restore.py

A throwaway PostgreSQL (common.embedded_db's, in a temporary folder on a free port), migrated; daphne
on it (a subprocess, no Redis); `--nodes` nodes, each the node client's own transport
(sapo_node.transport.websocket.WebSocketTransport, its outbox in the temporary folder) sharing one
honest group every `--every` seconds. Once every node has `--before` groups acknowledged, the
database is dumped (`pg_dump -Fc`, with the nodes sharing); once each has `--after` more, the nodes
stop sharing and wait for their verdicts. Then the server is stopped, the database dropped and
restored from the dump (`pg_restore` into a database created again), the server started again, and
the nodes reconnect. Counted: the groups the nodes hold as acknowledged, those the restored database
lacks right after the restore, and those it still lacks once the nodes have sent what it lost. The
run fails (exit status 1) unless that last count is 0.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from benchkit import ThrowawaySite, free_port, throwaway_site, use_checkout

use_checkout()


def honest_group(node: int, index: int):
    from sapo_node.groups import Group
    from sapo_node.tasks import CATALOGUES, TaskRef, build_entry, score_completion

    spec = CATALOGUES["sapo"].get("basic_arithmetic")
    seed = 5000 + node
    entry = build_entry(spec, seed, index)
    completions = [f"Let me think. <answer>{entry['answer']}</answer>"] * 2 + ["I guess <answer>no</answer>"] * 2
    return Group.new(
        round=index,
        task=TaskRef("basic_arithmetic", seed, index),
        question=entry["question"],
        answer=entry["answer"],
        completions=completions,
        rewards=[score_completion(spec, seed, entry, c) for c in completions],
    )


def acknowledged(outbox: Path) -> set[str]:
    with sqlite3.connect(outbox) as db:
        return {row[0] for row in db.execute("SELECT id FROM outbox WHERE state = 'accepted'")}


def stored(url: str, ids: set[str]) -> set[str]:
    import psycopg

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id::text FROM pool_rollout WHERE id::text = ANY(%s)", [list(ids)]).fetchall()
    return {row[0] for row in rows}


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--before", type=int, default=5, help="groups acknowledged per node before the dump")
    parser.add_argument("--after", type=int, default=10, help="more acknowledged per node after it")
    parser.add_argument("--every", type=float, default=0.3, help="seconds between a node's shares")
    args = parser.parse_args()
    with throwaway_site("restore", args.nodes) as site:
        return restore_under_nodes(args, site)


def restore_under_nodes(args: argparse.Namespace, site: ThrowawaySite) -> int:
    from common import embedded_db
    from sapo_node.transport.base import Hello
    from sapo_node.transport.websocket import WebSocketTransport

    var, url, tokens = site.var, site.url, site.tokens
    transports = []
    server = None
    try:
        port, log = free_port(), var / "server.log"
        server = site.start_server(port, log)
        print(f"{args.nodes} nodes, PostgreSQL on {url}, load average {os.getloadavg()[0]:.2f}")
        outboxes = [var / f"outbox-{i}.sqlite3" for i in range(args.nodes)]
        for i, token in enumerate(tokens):
            transport = WebSocketTransport(
                f"ws://127.0.0.1:{port}/ws/node/", token, outboxes[i], poll_interval=0.2, backoff_max=2.0
            )
            transport.start(Hello(client="bench-restore", model="m", hardware="h", local=1, external=0))
            transports.append(transport)
        shared = [0] * args.nodes

        def share_until(count: int) -> None:
            while min(t.counts().accepted for t in transports) < count:
                for i, transport in enumerate(transports):
                    transport.share([honest_group(i, shared[i])])
                    shared[i] += 1
                time.sleep(args.every * random.uniform(0.5, 1.5))

        share_until(args.before)
        dump = var / "pool.dump"
        pg = embedded_db._bin_dir()
        database = url.rsplit("/", 1)[1]
        admin = url.rsplit("/", 1)[0] + "/postgres"
        subprocess.run([str(pg / "pg_dump"), "-Fc", "-f", str(dump), url], check=True)
        print(f"dumped with {sum(t.counts().accepted for t in transports)} groups acknowledged")
        share_until(args.before + args.after)
        wait(lambda: all(t.flush(0.1) for t in transports), 60, "the last verdicts")
        held = set().union(*(acknowledged(o) for o in outboxes))
        print(f"{len(held)} groups acknowledged in all")

        server.terminate()
        server.wait(30)
        subprocess.run([str(pg / "dropdb"), "--force", f"--maintenance-db={admin}", database], check=True)
        subprocess.run([str(pg / "createdb"), f"--maintenance-db={admin}", database], check=True)
        subprocess.run([str(pg / "pg_restore"), "-d", url, str(dump)], check=True)
        lost = held - stored(url, held)
        print(f"restored: the database lacks {len(lost)} of them")
        server = site.start_server(port, log)
        deadline = time.monotonic() + 120
        while (missing := held - stored(url, held)) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(f"once the nodes reconnected: {len(missing)} missing; load average {os.getloadavg()[0]:.2f}")
        return 1 if missing else 0
    finally:
        for transport in transports:
            transport.close()
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
