"""A backup restored under running nodes: is every acknowledged group back? (docs/deploy.md, "Backups
and restore").

    .venv/bin/python bench/restore.py                          # 4 nodes, a dump into a database created again
    .venv/bin/python bench/restore.py --method clean           # pg_restore --clean into the same database
    .venv/bin/python bench/restore.py --nodes 2 --late 1 --before 3 --after 6 --method clean
                                                               # tests/integration/test_backup_restore.py

A throwaway PostgreSQL (common.embedded_db's, in a temporary folder on a free port), migrated; daphne
on it (a subprocess, no Redis); `--nodes` nodes, each the node client's own transport
(sapo_node.transport.websocket.WebSocketTransport, its outbox in the temporary folder) sharing one
honest group every `--every` seconds. Once every node has `--before` groups acknowledged, the backup
is made with the nodes sharing. Then `--late` more nodes are registered (they are not in the backup)
and share too; once every node has `--after` more groups acknowledged, the nodes stop sharing and
wait for their verdicts. Then the server is stopped, the backup restored by `--method`, and the
server started again:

- recreate: the database dropped and created again, `pg_restore` into it (backup: `pg_dump -Fc`);
- clean: `pg_restore --clean --if-exists` into the same database (backup: `pg_dump -Fc`);
- schema: the schema `public` dropped and created again, `pg_restore` into it (backup: `pg_dump -Fc`);
- cluster: a new cluster (initdb), its database created, `pg_restore` into it (backup: `pg_dump -Fc`);
- copy: the data directory put back from a copy made while PostgreSQL was stopped (the nodes see the
  database down for a moment), then the pool's epoch marker deleted, as docs/deploy.md says.

The nodes reconnect. A late node is refused (4401: its token is not in the backup) and keeps its
outbox; its owner registers it again and it starts over on the same outbox with the new token.
Counted: the groups the nodes hold as acknowledged, those the restored database lacks right after
the restore, and those it still lacks once the nodes have sent what it lost. The run fails (exit
status 1) unless that last count is 0.
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


METHODS = ("recreate", "clean", "schema", "cluster", "copy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4, help="nodes registered before the backup")
    parser.add_argument("--late", type=int, default=1, help="nodes registered after it")
    parser.add_argument("--before", type=int, default=5, help="groups acknowledged per node before the backup")
    parser.add_argument("--after", type=int, default=10, help="more acknowledged per node after it")
    parser.add_argument("--every", type=float, default=0.3, help="seconds between a node's shares")
    parser.add_argument("--method", choices=METHODS, default="recreate", help="how the backup is made and restored")
    args = parser.parse_args()
    with throwaway_site("restore", args.nodes) as site:
        return restore_under_nodes(args, site)


class Backup:
    """The backup of `--method`: made with the nodes sharing, restored with the site stopped."""

    def __init__(self, method: str, site: ThrowawaySite) -> None:
        from common import embedded_db

        self.method, self.var, self.url = method, site.var, site.url
        self.pg = embedded_db._bin_dir()
        self.database = self.url.rsplit("/", 1)[1]
        self.admin = self.url.rsplit("/", 1)[0] + "/postgres"
        self.port = int(self.url.rsplit(":", 1)[1].split("/")[0])
        self.dump = self.var / "pool.dump"
        self.copy = self.var / "postgres-copy"

    def make(self) -> None:
        from common import embedded_db

        if self.method != "copy":
            subprocess.run([str(self.pg / "pg_dump"), "-Fc", "-f", str(self.dump), self.url], check=True)
            return
        embedded_db.stop()  # a copy of a stopped cluster: the nodes meet a database that is down
        subprocess.run(["cp", "-a", str(embedded_db.pgdata_dir()), str(self.copy)], check=True)
        embedded_db.start_on(self.port)

    def restore(self) -> None:
        import psycopg

        from common import embedded_db

        pg_restore = [str(self.pg / "pg_restore"), "-d", self.url, str(self.dump)]
        if self.method == "recreate":
            subprocess.run(
                [str(self.pg / "dropdb"), "--force", f"--maintenance-db={self.admin}", self.database], check=True
            )
            subprocess.run([str(self.pg / "createdb"), f"--maintenance-db={self.admin}", self.database], check=True)
            subprocess.run(pg_restore, check=True)
        elif self.method == "clean":
            # Its clean-up tries to drop each partition's primary key, which PostgreSQL refuses (the key is
            # the partitioned table's), then drops the partitions whole: those errors are harmless, and
            # pg_restore exits 1 for them. Any other error fails the run.
            result = subprocess.run([*pg_restore, "--clean", "--if-exists"], capture_output=True, text=True)
            errors = [line for line in result.stderr.splitlines() if "ERROR:" in line]
            inherited = [line for line in errors if "cannot drop inherited constraint" in line]
            if result.returncode != 0 and (not errors or inherited != errors):
                raise SystemExit(f"pg_restore --clean failed:\n{result.stderr[-3000:]}")
            print(f"pg_restore --clean: {len(inherited)} errors, each a partition's inherited primary key (harmless)")
        elif self.method == "schema":
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute("DROP SCHEMA public CASCADE")
                conn.execute("CREATE SCHEMA public")
            subprocess.run(pg_restore, check=True)
        elif self.method == "cluster":
            embedded_db.stop()
            embedded_db.pgdata_dir().rename(self.var / "postgres-before")
            embedded_db._init_if_needed()  # initdb
            embedded_db.start_on(self.port)
            embedded_db._ensure_database(self.port)
            subprocess.run(pg_restore, check=True)
        else:
            embedded_db.stop()
            subprocess.run(["rm", "-rf", str(embedded_db.pgdata_dir())], check=True)
            subprocess.run(["cp", "-a", str(self.copy), str(embedded_db.pgdata_dir())], check=True)
            embedded_db.start_on(self.port)
            with psycopg.connect(self.url, autocommit=True) as conn:  # docs/deploy.md: renew the epoch
                conn.execute("DELETE FROM pool_epochmarker")


def register(name: str) -> str:
    """A contributor and their node, as the site makes them: the node's token."""
    from accounts.services import user_create
    from nodes.services import node_create, node_token_issue

    user = user_create(username=name, display_name=name, password=None)
    return node_token_issue(node=node_create(owner=user, name=name))[1]


def restore_under_nodes(args: argparse.Namespace, site: ThrowawaySite) -> int:
    from django.db import connections

    from sapo_node.transport.base import Hello
    from sapo_node.transport.websocket import WebSocketTransport

    var, url = site.var, site.url
    hello = Hello(client="bench-restore", model="m", hardware="h", local=1, external=0)
    transports: list[WebSocketTransport] = []
    server = None
    try:
        port, log = free_port(), var / "server.log"
        endpoint = f"ws://127.0.0.1:{port}/ws/node/"
        server = site.start_server(port, log)
        print(
            f"{args.nodes} nodes and {args.late} registered after the backup, method {args.method}, "
            f"PostgreSQL on {url}, load average {os.getloadavg()[0]:.2f}"
        )
        outboxes = [var / f"outbox-{i}.sqlite3" for i in range(args.nodes + args.late)]

        def connect(i: int, token: str) -> WebSocketTransport:
            transport = WebSocketTransport(endpoint, token, outboxes[i], poll_interval=0.2, backoff_max=2.0)
            transport.start(hello)
            return transport

        transports.extend(connect(i, token) for i, token in enumerate(site.tokens))
        shared = [0] * len(outboxes)
        targets = [args.before] * args.nodes

        def share_until() -> None:
            while any(t.counts().accepted < n for t, n in zip(transports, targets, strict=True)):
                for i, transport in enumerate(transports):
                    transport.share([honest_group(i, shared[i])])
                    shared[i] += 1
                time.sleep(args.every * random.uniform(0.5, 1.5))

        share_until()
        backup = Backup(args.method, site)
        backup.make()
        print(f"backed up with {sum(t.counts().accepted for t in transports)} groups acknowledged")
        late = [register(f"late{i}") for i in range(args.late)]
        connections.close_all()
        transports.extend(connect(args.nodes + i, token) for i, token in enumerate(late))
        targets = [args.before + args.after] * args.nodes + [args.after] * args.late
        share_until()
        wait(lambda: all(t.flush(0.1) for t in transports), 60, "the last verdicts")
        held = set().union(*(acknowledged(o) for o in outboxes))
        print(f"{len(held)} groups acknowledged in all")

        server.terminate()
        server.wait(30)
        backup.restore()
        lost = held - stored(url, held)
        print(f"restored: the database lacks {len(lost)} of them")
        server = site.start_server(port, log)
        started = time.monotonic()
        if args.late:
            wait(
                lambda: all(t.status == "refused (4401)" for t in transports[args.nodes :]), 60, "the late nodes' 4401"
            )
            print(
                f"the {args.late} late nodes were refused (4401); registered again, they start over on their outboxes"
            )
            for i in range(args.nodes, len(transports)):
                transports[i].close()
                transports[i] = connect(i, register(f"late{i - args.nodes}"))
            connections.close_all()
        deadline = time.monotonic() + 120
        while (missing := held - stored(url, held)) and time.monotonic() < deadline:
            time.sleep(0.5)
        print(
            f"once the nodes reconnected: {len(missing)} missing, {time.monotonic() - started:.1f} s after the server "
            f"started; load average {os.getloadavg()[0]:.2f}"
        )
        return 1 if missing else 0
    finally:
        for transport in transports:
            transport.close()
        if server is not None and server.poll() is None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
