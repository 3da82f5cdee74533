"""Soak: one daphne server under N node clients for an hour, its resident memory sampled throughout
(docs/benchmarks.md, "Soak").

    nice -n 10 .venv/bin/python bench/soak.py --nodes 20 --minutes 60 --out docs/soak
    .venv/bin/python bench/soak.py --nodes 4 --minutes 2 --out /tmp/soak     # a smoke run

The server is daphne as docs/deploy.md runs it (the settings' defaults, moderation rules on), in its
own database on DATABASE_URL's server and with its own redis-server (a free port, no persistence):
channel layer, budgets, presence and limits in Redis, as a deployment has them. The nodes are the
node client's own transport (`sapo_node.transport.websocket.WebSocketTransport`, each with its own
outbox) driven by a thread that plays a round every `--round-seconds` (jittered): it shares
`--groups` honest groups of `--completions` completions (half right), takes what the buffer holds
and reports the round, as `sapo_node.loop` does without the model. A reader fetches `/swarm/` and
`/api/v1/swarm/` every 10 s.

Every `--every` seconds the server's RSS (/proc/PID/status VmRSS), its open descriptors and threads,
and Python's traced memory (tracemalloc, started in the server with `--frames` frames; 0 turns it
off) go to <out>/soak.csv; every 10 minutes the server writes a tracemalloc snapshot, and at the end
the largest growths between the first snapshot after the warm-up and the last are printed
(`Snapshot.compare_to`, by line). <out>/soak.png plots RSS and traced memory against time.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchkit import ROOT, pool_bench, use_checkout

use_checkout()

POOL = pool_bench()

#: The server: daphne, with a thread that writes Python's traced memory and periodic snapshots.
SERVER_SCRIPT = """
import os, sys, threading, time, tracemalloc
frames = int(os.environ["SOAK_FRAMES"])
if frames:
    tracemalloc.start(frames)
def watch(out=os.environ["SOAK_DIR"], every=float(os.environ["SOAK_EVERY"])):
    started, snaps = time.monotonic(), 0
    while True:
        time.sleep(every)
        if not frames:
            continue
        with open(os.path.join(out, "traced.csv"), "a") as f:
            f.write(f"{time.monotonic() - started:.1f},{tracemalloc.get_traced_memory()[0]}\\n")
        if time.monotonic() - started >= snaps * 600 + 600:
            tracemalloc.take_snapshot().dump(os.path.join(out, f"snap-{snaps:02d}.tracemalloc"))
            snaps += 1
threading.Thread(target=watch, daemon=True).start()
import django
django.setup()
from daphne.cli import CommandLineInterface
sys.argv[0] = "daphne"
CommandLineInterface.entrypoint()
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_bench_soak")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--round-seconds", type=float, default=10.0, help="each node's mean round time")
    parser.add_argument("--groups", type=int, default=2, help="groups a node shares per round")
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--frames", type=int, default=8, help="tracemalloc frames in the server (0: off)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "soak")
    args = parser.parse_args()
    args.catalogue = "easy"
    return args


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    port = POOL.free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
        + ["--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 20
    import socket

    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def start_server(args: argparse.Namespace, port: int, redis_url: str, log) -> subprocess.Popen:
    env = POOL.server_env(args, "bench-soak", redis_url=redis_url)
    env.update(SOAK_FRAMES=str(args.frames), SOAK_DIR=str(args.out), SOAK_EVERY=str(args.every))
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, "-b", "127.0.0.1", "-p", str(port), "-v", "0", "config.asgi:application"],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    import socket

    deadline = time.time() + 120
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            raise SystemExit("daphne exited during start-up")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("daphne did not start listening in 120 s")


def proc_figures(pid: int) -> tuple[int, int, int]:
    """RSS in KiB, open descriptors, threads."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def play(index: int, transport, args: argparse.Namespace, stop: threading.Event, tally: dict) -> None:
    """One node's rounds: share honest groups, take external ones, report (sapo_node.loop without a model)."""
    from sapo_node.groups import Group
    from sapo_node.tasks import CATALOGUES, TaskRef, build_entry, score_completion

    catalogue = CATALOGUES[args.catalogue]
    rng = random.Random(index)
    seed = 1000 + index
    round_ = 0
    while not stop.wait(args.round_seconds * rng.uniform(0.5, 1.5)):
        groups = []
        for g in range(args.groups):
            q = round_ * args.groups + g
            spec = catalogue.tasks[q % len(catalogue.tasks)]
            entry = build_entry(spec, seed, q)
            words = " ".join(rng.choice(POOL.REASONING_WORDS) for _ in range(40))
            completions = [
                f"{words} <answer>{entry['answer'] if k % 2 == 0 else 'no idea'}</answer>"
                for k in range(args.completions)
            ]
            rewards = [score_completion(spec, seed, entry, c) for c in completions]
            groups.append(
                Group.new(
                    round=round_,
                    task=TaskRef(spec.dataset, seed, q),
                    question=entry["question"],
                    answer=entry["answer"],
                    completions=completions,
                    rewards=rewards,
                )
            )
        transport.share(groups)
        external = transport.take_external(4)
        transport.report(
            {
                "round": round_,
                "local": args.groups,
                "external": 4,
                "reward_mean": 0.5,
                "reward_std": 0.5,
                "used": [g.id for g in external],
            }
        )
        tally["rounds"] += 1
        round_ += 1


def read_pages(base: str, stop: threading.Event, tally: dict) -> None:
    while not stop.wait(10.0):
        for path in ("/swarm/", "/api/v1/swarm/"):
            try:
                with urllib.request.urlopen(base + path, timeout=30) as reply:
                    reply.read()
                tally["pages"] += 1
            except Exception:  # counted, and the server log says why
                tally["page_errors"] += 1


def plot(args: argparse.Namespace, rows: list[dict], traced: list[tuple[float, int]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([r["minutes"] for r in rows], [r["rss_kib"] / 1024 for r in rows], label="server RSS")
    if traced:
        ax.plot([t / 60 for t, _ in traced], [b / 2**20 for _, b in traced], label="Python traced (tracemalloc)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MiB")
    ax.set_title(f"soak: {args.nodes} nodes, one daphne server")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out / "soak.png", dpi=100)


def top_growth(args: argparse.Namespace) -> None:
    import tracemalloc

    snaps = sorted(args.out.glob("snap-*.tracemalloc"))
    if len(snaps) < 2:
        return
    first, last = tracemalloc.Snapshot.load(str(snaps[0])), tracemalloc.Snapshot.load(str(snaps[-1]))
    keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = last.filter_traces(keep).compare_to(first.filter_traces(keep), "lineno")
    print(f"\ntracemalloc: largest growths from {snaps[0].name} to {snaps[-1].name}")
    for stat in stats[:15]:
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {stat.traceback[0]}")


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("snap-*.tracemalloc"), args.out / "traced.csv"]:
        old.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sapo-soak-"))
    print(
        f"Soak: {args.nodes} nodes, {args.minutes:g} min, {os.cpu_count()} CPUs; load average at start "
        f"{os.getloadavg()}"
    )
    os.environ["SAPO_REDIS_PREFIX"] = f"soak{os.getpid()}"
    args.bench_url = POOL.with_db(args.database_url, args.db_name)
    POOL.recreate_database(args.database_url, args.db_name)
    redis, redis_port = start_redis(work)
    server = None
    stop = threading.Event()
    transports = []
    tally = {"rounds": 0, "pages": 0, "page_errors": 0}
    try:
        POOL.setup_django(args)
        nodes = POOL.make_nodes(args.nodes, "soak")
        POOL.fill_pool(2000, [node.id for node, _ in nodes], 86_400)
        from django.db import connections

        connections.close_all()
        port = POOL.free_port()
        log = (work / "server.log").open("w")
        server = start_server(args, port, f"redis://127.0.0.1:{redis_port}/0", log)

        from sapo_node.transport.base import Hello
        from sapo_node.transport.websocket import WebSocketTransport

        threads = []
        for i, (_, token) in enumerate(nodes):
            transport = WebSocketTransport(f"ws://127.0.0.1:{port}/ws/node/", token, work / f"outbox-{i}.sqlite3")
            transport.start(Hello(client="bench-soak", model="m", hardware="h", local=args.groups, external=4))
            transports.append(transport)
            threads.append(threading.Thread(target=play, args=(i, transport, args, stop, tally), daemon=True))
        threads.append(threading.Thread(target=read_pages, args=(f"http://127.0.0.1:{port}", stop, tally), daemon=True))
        for thread in threads:
            thread.start()

        rows = []
        started = time.monotonic()
        with (args.out / "soak.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["minutes", "rss_kib", "fds", "threads", "load1", "rounds", "accepted"])
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(args.every)
                rss, fds, nthreads = proc_figures(server.pid)
                accepted = sum(t.counts().accepted for t in transports)
                row = {"minutes": (time.monotonic() - started) / 60, "rss_kib": rss}
                rows.append(row)
                writer.writerow(
                    [
                        f"{row['minutes']:.2f}",
                        rss,
                        fds,
                        nthreads,
                        f"{os.getloadavg()[0]:.2f}",
                        tally["rounds"],
                        accepted,
                    ]
                )
                f.flush()
        stop.set()
        counts = [t.counts() for t in transports]
        traced = []
        if (args.out / "traced.csv").exists():
            for line in (args.out / "traced.csv").read_text().splitlines():
                t, b = line.split(",")
                traced.append((float(t), int(b)))
        plot(args, rows, traced)
        warm = [r for r in rows if r["minutes"] >= 10]
        if len(warm) > 2:
            slope = (warm[-1]["rss_kib"] - warm[0]["rss_kib"]) / 1024 / (warm[-1]["minutes"] - warm[0]["minutes"])
            print(
                f"RSS {rows[0]['rss_kib'] / 1024:.0f} MiB at the first sample, {warm[0]['rss_kib'] / 1024:.0f} MiB at "
                f"10 min, {rows[-1]['rss_kib'] / 1024:.0f} MiB at the end, max {max(r['rss_kib'] for r in rows) / 1024:.0f}"
                f" MiB: {slope:+.3f} MiB a minute after minute 10"
            )
        print(
            f"{tally['rounds']} rounds, {sum(c.accepted for c in counts)} groups accepted, "
            f"{sum(c.rejected for c in counts)} rejected, {sum(c.pending for c in counts)} pending; "
            f"{tally['pages']} page reads, {tally['page_errors']} failed"
        )
        errors = [
            line for line in (work / "server.log").read_text().splitlines() if "ERROR" in line or "Traceback" in line
        ]
        print(f"server log: {len(errors)} error lines" + (f", first: {errors[0][:300]}" if errors else ""))
        top_growth(args)
    finally:
        stop.set()
        for transport in transports:
            transport.close()
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
        redis.kill()
        redis.wait()
        from django.db import connections

        connections.close_all()
        for connection in connections.all(initialized_only=True):
            connection.close_pool()
        POOL.recreate_database(args.database_url, args.db_name, drop_only=True)
        shutil.rmtree(work, ignore_errors=True)
        for snap in args.out.glob("snap-*.tracemalloc"):
            snap.unlink()
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
