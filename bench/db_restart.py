"""PostgreSQL restarted under nodes: what the nodes and the server's log see once the database is back.

    .venv/bin/python bench/db_restart.py               # 10 nodes; a fast restart, then a crash-like one
    .venv/bin/python bench/db_restart.py --nodes 20 --after 30

A throwaway PostgreSQL (common.embedded_db's, in a temporary folder on a free port), migrated; daphne
on it (a subprocess; its warnings and errors written to a file); `--nodes` nodes, each on its own
socket sending share (a fresh honest group), sample and hello in turn, one frame at a time, and
reconnecting half a second after a close. Once every node is answered, the database is restarted
twice: `pg_ctl restart -m fast`, then `pg_ctl stop -m immediate` and a start (a crash: no
checkpoint, recovery at start-up). For each, from the moment the database answers again, `--after`
seconds of traffic, and counted: `internal_error` replies, closes and their codes (before: 4503 while
it is down), ERROR lines and "Exception inside application" in the server's log, and how long until
every node had an answer again. The run fails (exit status 1) on any `internal_error` or ERROR line
after the database was back.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from pathlib import Path

from benchkit import free_port, throwaway_site, use_checkout

use_checkout()


def honest_group(catalogue, rng_index: int) -> dict:
    from sapo_node.ids import uuid7
    from sapo_node.tasks import build_entry, score_completion

    spec = catalogue.get("basic_arithmetic")
    seed, index = 1000 + rng_index, rng_index % 50
    entry = build_entry(spec, seed, index)
    completions = [f"Let me think. <answer>{entry['answer']}</answer>"] * 2 + ["I guess <answer>no</answer>"] * 2
    return {
        "id": str(uuid7()),
        "round": 1,
        "task": {"dataset": "basic_arithmetic", "seed": seed, "index": index},
        "question": entry["question"],
        "answer": entry["answer"],
        "completions": completions,
        "rewards": [score_completion(spec, seed, entry, c) for c in completions],
    }


class Tally:
    """What the nodes saw: (time, node, what) for every reply and close."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int, str]] = []

    def add(self, node: int, what: str) -> None:
        self.events.append((time.monotonic(), node, what))

    def since(self, moment: float) -> collections.Counter:
        return collections.Counter(what for at, _, what in self.events if at >= moment)

    def until(self, start: float, end: float) -> collections.Counter:
        return collections.Counter(what for at, _, what in self.events if start <= at < end)

    def all_answered_after(self, moment: float, nodes: int) -> float | None:
        """Seconds from `moment` until every node had a non-error reply."""
        seen: dict[int, float] = {}
        for at, node, what in self.events:
            if at >= moment and not what.startswith(("error", "close")) and node not in seen:
                seen[node] = at
        return max(seen.values()) - moment if len(seen) == nodes else None


async def node_loop(url: str, token: str, node: int, tally: Tally, stop: asyncio.Event, catalogue) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    sent = 0
    while not stop.is_set():
        try:
            async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30) as ws:
                frames = [{"type": "hello", "v": 1, "client": "bench", "model": "m", "hardware": "h"}]
                while not stop.is_set():
                    if not frames:
                        sent += 1
                        frames = [
                            {"type": "share", "v": 1, "rollouts": [honest_group(catalogue, node * 100_000 + sent)]},
                            {"type": "sample", "v": 1, "n": 4},
                            {"type": "hello", "v": 1, "client": "bench", "model": "m", "hardware": "h"},
                        ]
                    await ws.send(json.dumps(frames.pop(0)))
                    reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
                    tally.add(node, f"error {reply['code']}" if reply["type"] == "error" else reply["type"])
                    await asyncio.sleep(0.05)
        except ConnectionClosed as exc:
            tally.add(node, f"close {exc.rcvd.code if exc.rcvd else None}")
        except (OSError, TimeoutError) as exc:
            tally.add(node, f"close {type(exc).__name__}")
        await asyncio.sleep(0.5)


def wait_for_database(url: str) -> None:
    """Returns once the database answers a query."""
    import psycopg

    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.Error:
            time.sleep(0.05)


def start_again(port: int) -> None:
    """Starts the stopped server on its port (common.embedded_db.start_on)."""
    from common import embedded_db

    embedded_db.start_on(port)


async def scenario(args, url: str, ws_url: str, tokens: list[str], log_path: Path, catalogue) -> int:
    from common import embedded_db

    port = int(url.rsplit(":", 1)[1].split("/")[0])

    tally, stop = Tally(), asyncio.Event()
    tasks = [asyncio.create_task(node_loop(ws_url, t, i, tally, stop, catalogue)) for i, t in enumerate(tokens)]
    started = time.monotonic()
    await asyncio.sleep(5)
    if tally.all_answered_after(started, len(tokens)) is None:
        print("not every node was answered before the restarts", tally.since(started))
    failures = 0
    restarts = {
        "fast (pg_ctl restart -m fast)": lambda: embedded_db._pg("pg_ctl", ["-w", "-t", "60", "-m", "fast", "restart"]),
        "crash-like (pg_ctl stop -m immediate, start)": lambda: (
            embedded_db._pg("pg_ctl", ["-w", "-t", "60", "-m", "immediate", "stop"]),
            start_again(port),
        ),
    }
    for name, restart in restarts.items():
        down_at = time.monotonic()
        log_before = await asyncio.to_thread(os.path.getsize, log_path)
        await asyncio.to_thread(restart)
        await asyncio.to_thread(wait_for_database, url)
        back_at = time.monotonic()
        log_at_back = await asyncio.to_thread(os.path.getsize, log_path)
        await asyncio.sleep(args.after)
        during, after = tally.until(down_at, back_at), tally.since(back_at)
        log = await asyncio.to_thread(log_path.read_bytes)
        log_during, log_after = (
            log[log_before:log_at_back].decode(errors="replace"),
            log[log_at_back:].decode(errors="replace"),
        )
        errors_after = [line for line in log_after.splitlines() if " ERROR " in line or "Exception inside" in line]
        internal_after = after.get("error internal_error", 0)
        everyone = tally.all_answered_after(back_at, len(tokens))
        print(f"\n{name}: database down {back_at - down_at:.1f} s")
        print(f"  while down: {dict(sorted(during.items()))}")
        print(
            f"  while down, server log: {sum(' ERROR ' in x for x in log_during.splitlines())} ERROR lines, "
            f"{sum(' WARNING ' in x for x in log_during.splitlines())} WARNING lines"
        )
        print(f"  {args.after:.0f} s after it is back: {dict(sorted(after.items()))}")
        print(
            f"  after, server log: {len(errors_after)} ERROR lines; every node answered again after "
            f"{'-' if everyone is None else f'{everyone:.1f} s'}"
        )
        for line in errors_after[:5]:
            print("   ", line[:200])
        failures += internal_after + len(errors_after) + (everyone is None)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--after", type=float, default=20.0, help="seconds of traffic after each restart")
    args = parser.parse_args()
    from sapo_node.tasks import CATALOGUES

    with throwaway_site("restart", args.nodes) as site:
        port, log_path = free_port(), site.var / "server.log"
        server = site.start_server(port, log_path)
        try:
            print(f"{args.nodes} nodes, PostgreSQL on {site.url}, load average {os.getloadavg()[0]:.2f}")
            ws_url = f"ws://127.0.0.1:{port}/ws/node/"
            failures = asyncio.run(scenario(args, site.url, ws_url, site.tokens, log_path, CATALOGUES["sapo"]))
        finally:
            server.terminate()
            server.wait(30)
    print(f"\nload average {os.getloadavg()[0]:.2f}; {'FAILED' if failures else 'clean'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
