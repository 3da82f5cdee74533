"""Node sockets at scale: N authenticated node sockets against one or two ASGI server processes
(docs/benchmarks.md, "Sockets").

    .venv/bin/python bench/sockets.py             # N = 1,000, daphne (a few minutes)
    .venv/bin/python bench/sockets.py --quick     # N = 50 (tests/platform/test_bench_sockets.py)
    .venv/bin/python bench/sockets.py --n 300 --redis-url redis://127.0.0.1:6379/0
    .venv/bin/python bench/sockets.py --workers 2 --redis-url redis://127.0.0.1:6379/0   # two site processes
    .venv/bin/python bench/sockets.py --n 10000 --servers daphne,uvicorn --rounds 2 --skip-restart
                                                  # ten thousand, each server in turn, storm and steady rate
    .venv/bin/python bench/sockets.py --trees /tmp/base,. --rounds 3   # two commits' servers, alternating

Each server (`--servers`, taken in turn, `--rounds` times: compared in one run, alternating; with
`--trees`, each server from each of those source trees in turn, as bench/pool.py's --trees) is
started as docs/deploy.md says, the settings' defaults (connection pool, moderation rules on):
`daphne` with no access log and a listen backlog of 4096; `uvicorn` with the same backlog, no access
log, the protocol's frame limit and no per-message compression (as daphne), and its loop, HTTP parser
and WebSocket implementation named as `uvicorn:LOOP:HTTP:WS` (`uvicorn` alone: uvloop, httptools,
websockets-sansio). Its database is its own (`--db-name`, dropped at the end) on DATABASE_URL's
server; with --redis-url, Redis for the channel layer, rate counts and presence, as a multi-process
deployment has. The clients are this process (asyncio and the `websockets` library, no pings of
their own: the servers ping every 20 s), one node and token each; on this machine they share the
cores with the servers, so a latency here includes the clients' own CPU. Both this process and
the servers raise their open-file limit to what N needs (up to the hard limit). Phases, each printed
with the load average (1 min) at its start and end:

(a) welcome, idle: sockets opened one at a time (connect, `hello`, `welcome`);
(b) welcome, all at once (the storm): N sockets opened at the same moment, the time from connect to
    the end of the WebSocket handshake, and to the welcome (and the servers' CPU time per socket: on
    a shared machine it says more than the latency);
(c) sample, idle: `sample` (n=8, on a pool of 2,000 groups) from one socket at a time;
(d) sample, all at once: every open socket sends `sample` at the same moment;
(e) server memory: RSS with the N sockets open minus RSS with none, per socket;
(g) steady rate (`--steady-seconds`, 0 skips it): every node sends `sample` every `--period` seconds,
    the nodes spread evenly over the period, for one period of warm-up and then the measured seconds;
(f) restart: the server is killed (SIGKILL) with the N sockets open and started again on the same
    port; every node reconnects with the node client's policy (sapo_node.transport.websocket:
    retry_pause, OPEN_TIMEOUT, WELCOME_TIMEOUT). Reported: the time from the kill until all N are
    welcomed again, how long the server took to listen again, connection attempts refused while it
    was down, and dropped sessions: sockets that opened but ended (or timed out) before their welcome.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import leanws
from benchkit import ROOT, load, pool_bench, use_checkout

use_checkout()

POOL = pool_bench()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_bench_sockets")
    parser.add_argument("--n", type=int, default=1000, help="sockets (one node each)")
    parser.add_argument("--idle", type=int, default=50, help="welcomes and samples timed one at a time")
    parser.add_argument("--redis-url", default="", help="give the server Redis (channel layer, rate counts, presence)")
    parser.add_argument("--quick", action="store_true", help="N=50, 10 idle: a smoke test")
    parser.add_argument("--skip-restart", action="store_true")
    parser.add_argument(
        "--workers", type=int, default=1, help="site processes (docs/deploy.md, Scale-out); above 1 needs --redis-url"
    )
    parser.add_argument(
        "--servers", default="daphne", help="comma-separated: daphne, uvicorn or uvicorn:LOOP:HTTP:WS, taken in turn"
    )
    parser.add_argument("--rounds", type=int, default=1, help="times every server is measured, alternating")
    parser.add_argument(
        "--trees",
        default="",
        help="source trees the servers run (their platform/ and node_client/), comma-separated: each server"
        " measured from each, in alternation (default: this one); the database is made with this tree's migrations",
    )
    parser.add_argument(
        "--client",
        choices=("websockets", "lean"),
        default="websockets",
        help="the clients' WebSocket: the node client's library, or bench/leanws.py (less of the shared CPU)",
    )
    parser.add_argument("--steady-seconds", type=float, default=0, help="(g) the steady rate's measured time")
    parser.add_argument("--period", type=float, default=10.0, help="(g) seconds between a node's samples")
    parser.add_argument(
        "--after-pid", type=int, default=0, help="make the nodes, then wait for this process to end before measuring"
    )
    args = parser.parse_args()
    if args.workers > 1 and not args.redis_url:
        parser.error("--workers above 1 needs --redis-url: processes share presence and rate counts through Redis")
    if args.quick:
        args.n, args.idle = 50, 10
        args.steady_seconds = args.steady_seconds or 3
        args.period = min(args.period, 1.0)
    args.servers = [server_spec(name) for name in args.servers.split(",")]
    args.trees = [Path(t).resolve() for t in args.trees.split(",")] if args.trees else []
    args.catalogue = "easy"
    return args


UVICORN_DEFAULTS = ("uvloop", "httptools", "websockets-sansio")


def server_spec(name: str) -> tuple[str, ...]:
    """("daphne",) or ("uvicorn", loop, http, ws) from `daphne`, `uvicorn` or `uvicorn:LOOP:HTTP:WS`."""
    parts = name.strip().split(":")
    if parts[0] == "daphne" and len(parts) == 1:
        return ("daphne",)
    if parts[0] == "uvicorn" and len(parts) <= 4:
        return ("uvicorn", *parts[1:], *UVICORN_DEFAULTS[len(parts) - 1 :])
    raise SystemExit(f"unknown server {name!r}: daphne, uvicorn or uvicorn:LOOP:HTTP:WS")


def server_name(spec: tuple[str, ...], tree: int | None = None) -> str:
    """The server column: `spec`, and the index of its --trees tree when there are trees."""
    return ":".join(spec) + ("" if tree is None else f" (tree {tree})")


def raise_fd_limit(n: int) -> None:
    """Each socket is a file descriptor here and one in the server (which inherits the limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 2 * n + 1024)) if hard != resource.RLIM_INFINITY else max(soft, 2 * n + 1024)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < n + 256:
        raise SystemExit(f"the open-file limit ({hard}) is too low for {n} sockets")


def server_command(args: argparse.Namespace, spec: tuple[str, ...], port: int) -> list[str]:
    """The command `manage.py sapo_serve` runs for `spec` (ops.serving), on 127.0.0.1:port; daphne through
    bench/pool.py's SERVER_SCRIPT (the same daphne, moderation rules on), uvicorn with the loop, HTTP
    parser and WebSocket implementation `spec` names."""
    from ops.serving import server_argv

    argv = server_argv(spec[0], host="127.0.0.1", port=port, websocket_max_bytes=args.websocket_max_bytes)
    if spec[0] == "daphne":
        return [sys.executable, "-c", POOL.SERVER_SCRIPT, "with", *argv[3:]]
    for option, value in zip(("--loop", "--http", "--ws"), spec[1:], strict=True):
        argv[argv.index(option) + 1] = value
    return argv


def start_server(
    args: argparse.Namespace, spec: tuple[str, ...], port: int, log, worker: int = 0, tree: Path = ROOT
) -> subprocess.Popen:
    """The server `spec` on 127.0.0.1:port, the settings' defaults, running the source tree `tree`;
    `worker` names the process in presence records."""
    # The restarted process gets a new name: it forgets its previous run's sockets.
    env = POOL.server_env(args, f"bench-sockets-{worker}", redis_url=args.redis_url or None, tree=tree)
    for name in ("SAPO_CONN_MAX_AGE", "SAPO_DB_POOL_SIZE"):
        env.pop(name, None)
    proc = subprocess.Popen(server_command(args, spec, port), env=env, cwd=tree, stdout=log, stderr=log)
    deadline = time.time() + 120
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            raise SystemExit(f"{spec[0]} exited during start-up (log: {log.name})")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{spec[0]} did not start listening in 120 s")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and max of latencies, in seconds."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], ordered[-1]


def row(server: str, what: str, values: list[float], started: str, extra: str = "") -> None:
    p50, p99, top = percentiles(values)
    print(
        f"| {server} | {what} | {len(values)} | {p50 * 1000:.0f} | {p99 * 1000:.0f} | {top * 1000:.0f} | {extra} "
        f"| {started}-{load()} |",
        flush=True,
    )


# --- the clients ------------------------------------------------------------------------------


class Node:
    """One node's socket, opened and welcomed the way sapo_node's transport does it. The replies are
    told apart by their first characters (the server writes "type" first): parsing ten thousand
    samples' JSON would be the clients' largest cost, on the cores the server needs."""

    def __init__(self, url: str, token: str, index: int) -> None:
        self.url, self.token, self.index = url, token, index
        self.ws = None
        self.ref = 0
        self.handshake = 0.0  # seconds from connect to the end of the WebSocket handshake

    #: "websockets" (the node client's library) or "lean" (bench/leanws.py: less of the clients' CPU).
    client = "websockets"

    async def open(self, *, open_timeout: float, welcome_timeout: float) -> None:
        import websockets

        from sapo_node import protocol

        started = time.perf_counter()
        if self.client == "lean":
            self.ws = await leanws.connect(
                self.url, headers={"Authorization": f"Bearer {self.token}"}, open_timeout=open_timeout
            )
        else:
            self.ws = await websockets.connect(
                self.url,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                max_size=None,
                open_timeout=open_timeout,
                ping_interval=None,
                proxy=None,
            )
        self.handshake = time.perf_counter() - started
        try:
            await self.ws.send(
                json.dumps(protocol.frame(protocol.HELLO, client="bench-sockets", model="m", hardware="h"))
            )
            reply = await asyncio.wait_for(self.ws.recv(), timeout=welcome_timeout)
        except BaseException:
            await self.ws.close()
            raise
        if not reply.startswith('{"type":"welcome"'):
            await self.ws.close()
            raise RuntimeError(f"node {self.index}: expected a welcome, got {reply[:200]}")

    async def sample(self) -> None:
        from sapo_node import protocol

        self.ref += 1
        await self.ws.send(json.dumps(protocol.frame(protocol.SAMPLE, n=8, ref=str(self.ref))))
        reply = await self.ws.recv()
        if not reply.startswith('{"type":"samples"'):
            raise RuntimeError(f"node {self.index}: expected samples, got {reply[:200]}")


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def come_back(node: Node, killed_at: float, counts: dict[str, int]) -> float:
    """Reconnect after the server went away, with the node client's backoff; the time from the kill
    to the welcome."""
    from sapo_node.transport.websocket import BACKOFF_MAX, BACKOFF_MIN, OPEN_TIMEOUT, WELCOME_TIMEOUT, retry_pause

    delay = BACKOFF_MIN
    while True:
        await asyncio.sleep(retry_pause(delay))
        counts["attempts"] += 1
        try:
            await node.open(open_timeout=OPEN_TIMEOUT, welcome_timeout=WELCOME_TIMEOUT)
            return time.perf_counter() - killed_at
        except ConnectionRefusedError:
            counts["refused"] += 1
        except Exception as exc:  # opened (or half-opened) and lost before the welcome
            counts["dropped"] += 1
            why = type(exc).__name__
            counts["why"][why] = counts["why"].get(why, 0) + 1
        delay = min(delay * 2, BACKOFF_MAX)


async def steady(nodes: list[Node], period: float, measured: float) -> tuple[list[float], int]:
    """(g): each node sends `sample` every `period` s, node i first at i/N of a period; latencies of the
    samples sent in the `measured` seconds after one period of warm-up, and the samples that failed."""
    begin = time.perf_counter() + 0.5
    measure_from, measure_to = begin + period, begin + period + measured
    latencies: list[float] = []
    failed = [0]

    async def poll(i: int, node: Node) -> None:
        due = begin + period * i / len(nodes)
        while due < measure_to:
            await asyncio.sleep(due - time.perf_counter())
            sent = time.perf_counter()
            try:
                await node.sample()
            except Exception:
                failed[0] += 1
                return
            if sent >= measure_from:
                latencies.append(time.perf_counter() - sent)
            due += period

    await asyncio.gather(*(poll(i, node) for i, node in enumerate(nodes)))
    return latencies, failed[0]


def servers_cpu(servers: dict) -> float:
    return sum(POOL.process_cpu(proc.pid) or 0.0 for proc in servers["procs"])


def servers_rss(servers: dict) -> int:
    return sum(rss_kib(proc.pid) for proc in servers["procs"])


def per_socket(servers: dict, cpu_before: tuple[float, float], n: int, what: str = "socket") -> str:
    """The servers' CPU time since `cpu_before` (from cpu_now), and the clients' (this process: on this
    machine they share the cores with the server)."""
    server, clients = servers_cpu(servers) - cpu_before[0], time.process_time() - cpu_before[1]
    return (
        f"server CPU {server:.1f} s, {server / n * 1000:.2f} ms per {what}; "
        f"clients' CPU {clients / n * 1000:.2f} ms per {what}"
    )


def cpu_now(servers: dict) -> tuple[float, float]:
    return servers_cpu(servers), time.process_time()


def start_servers(
    args: argparse.Namespace, spec: tuple[str, ...], ports: list[int], log, tree: Path = ROOT
) -> list[subprocess.Popen]:
    return [start_server(args, spec, port, log, worker, tree) for worker, port in enumerate(ports)]


async def run_phases(
    args: argparse.Namespace, spec: tuple[str, ...], ports: list[int], tokens: list[str], servers: dict
) -> None:
    # Node i on worker i mod K: what a round-robin proxy in front of the workers does.
    urls = [f"ws://127.0.0.1:{port}/ws/node/" for port in ports]
    n, name = args.n, server_name(spec, servers["tree_index"])

    # Warm-up: the first socket imports nothing any more, but the first connection of each pool does.
    for worker_url in urls:
        warm = Node(worker_url, tokens[0], 0)
        await warm.open(open_timeout=30, welcome_timeout=30)
        await warm.sample()
        await warm.ws.close()
    await asyncio.sleep(0.5)
    rss_before = servers_rss(servers)

    # (a) welcome, idle: one at a time, on nodes (b) opens again later.
    started = load()
    idle = []
    for i in range(args.idle):
        node = Node(urls[i % len(urls)], tokens[i], i)
        idle.append(await timed(node.open(open_timeout=30, welcome_timeout=30)))
        await node.ws.close()
    row(name, "(a) welcome, one at a time", idle, started)
    await asyncio.sleep(1.0)

    # (b) welcome, all at once.
    started, cpu = load(), cpu_now(servers)
    nodes = [Node(urls[i % len(urls)], t, i) for i, t in enumerate(tokens)]
    latencies = await asyncio.gather(*(timed(node.open(open_timeout=120, welcome_timeout=120)) for node in nodes))
    handshakes = [node.handshake for node in nodes]
    row(name, "(b) welcome, all at once", list(latencies), started, per_socket(servers, cpu, n))
    row(name, "(b) of which the handshake", handshakes, started)
    await asyncio.sleep(1.0)

    # (c) sample, idle: one socket at a time.
    started = load()
    idle = [await timed(nodes[i % n].sample()) for i in range(args.idle)]
    row(name, "(c) sample, one at a time", idle, started, "n=8")
    await asyncio.sleep(1.0)

    # (d) sample, all at once.
    started, cpu = load(), cpu_now(servers)
    latencies = await asyncio.gather(*(timed(node.sample()) for node in nodes))
    row(name, "(d) sample, all at once", list(latencies), started, "n=8; " + per_socket(servers, cpu, n, "sample"))

    # (e) server memory per socket.
    await asyncio.sleep(1.0)
    rss_open = servers_rss(servers)
    print(
        f"| {name} | (e) server RSS | {n} | | | | {rss_before / 1024:.0f} MiB with none open, "
        f"{rss_open / 1024:.0f} MiB with {n}: **{(rss_open - rss_before) / n:.0f} KiB per socket** | {load()} |",
        flush=True,
    )

    # (g) steady rate: every node samples every `period` seconds.
    if args.steady_seconds > 0:
        started = load()
        cpu = None
        # The CPU is read over the whole phase (warm-up included): samples sent = N per period.
        cpu = cpu_now(servers)
        latencies, failed = await steady(nodes, args.period, args.steady_seconds)
        sent = n * (args.steady_seconds + args.period) / args.period
        row(
            name,
            f"(g) sample, steady: every {args.period:g} s",
            latencies,
            started,
            f"{n / args.period:.0f} samples/s for {args.steady_seconds:g} s; **{failed} failed**; "
            + per_socket(servers, cpu, sent, "sample"),
        )

    if args.skip_restart:
        await asyncio.gather(*(node.ws.close() for node in nodes))
        return

    # (f) restart: kill with the sockets open, start again on the same port, everyone comes back.
    started = load()
    counts = {"attempts": 0, "refused": 0, "dropped": 0, "why": {}}
    killed_at = time.perf_counter()
    for proc in servers["procs"]:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    returns = [asyncio.create_task(come_back(node, killed_at, counts)) for node in nodes]
    servers["procs"] = await asyncio.to_thread(start_servers, args, spec, ports, servers["log"], servers["tree"])
    listening = time.perf_counter() - killed_at
    back = await asyncio.gather(*returns)
    why = " (" + ", ".join(f"{k} {v}" for k, v in sorted(counts["why"].items())) + ")" if counts["why"] else ""
    print(
        f"| {name} | (f) all back after a restart (from the kill) | {n} | {statistics.median(back) * 1000:.0f} | "
        f"{percentiles(back)[1] * 1000:.0f} | **{max(back) * 1000:.0f}** | server listening again after "
        f"{listening:.1f} s; {counts['attempts']} attempts, {counts['refused']} refused while down, "
        f"**{counts['dropped']} dropped sessions**{why} | {started}-{load()} |",
        flush=True,
    )
    await asyncio.gather(*(node.ws.close() for node in nodes))


def client_loop(coro) -> None:
    """Run the clients on uvloop where it is installed (it is, with uvicorn): the clients share the
    cores with the server, and on uvloop a socket costs them much less CPU than on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def main() -> None:
    args = parse_args()
    Node.client = args.client
    raise_fd_limit(args.n)
    print(
        f"Sockets benchmark: N={args.n}, {args.workers} site process(es) of "
        f"{', '.join(server_name(spec) for spec in args.servers)} x {args.rounds} ({os.cpu_count()} CPUs, "
        f"{'Redis ' + args.redis_url if args.redis_url else 'no Redis: in-memory channel layer'}); "
        f"load average at start {os.getloadavg()}",
        flush=True,
    )
    # Abuse-limit counters (node creations per account) of earlier runs must not count: ids repeat.
    os.environ["SAPO_REDIS_PREFIX"] = f"benchsockets{os.getpid()}"
    args.bench_url = POOL.with_db(args.database_url, args.db_name)
    POOL.recreate_database(args.database_url, args.db_name)
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-sockets-{os.getpid()}.log"
    try:
        POOL.setup_django(args)
        from pool.limits import current_limits

        args.websocket_max_bytes = current_limits().websocket_max_bytes
        started = time.perf_counter()
        from django.db import transaction

        with transaction.atomic():  # one commit, not a wait for the disk per node
            nodes = POOL.make_nodes(args.n, "sock")
        POOL.fill_pool(2000, [node.id for node, _ in nodes[: min(50, args.n)]], 86_400)
        print(
            f"{args.n} nodes and tokens, 2,000 groups in the pool ({time.perf_counter() - started:.0f} s)", flush=True
        )
        from django.db import connections

        connections.close_all()
        while args.after_pid and Path(f"/proc/{args.after_pid}").exists():  # another run on these cores
            time.sleep(1.0)
        trees = list(enumerate(args.trees)) if args.trees else [(None, ROOT)]
        for index, tree in enumerate(args.trees):
            print(f"tree {index}: {tree}")
        print("\n| server | phase | sockets | p50 ms | p99 ms | max ms | notes | load start-end |")
        print("|---|---|---:|---:|---:|---:|---|---|", flush=True)
        with log_path.open("w") as log:
            for _ in range(args.rounds):
                for spec, (index, tree) in ((s, t) for s in args.servers for t in trees):
                    ports = [POOL.free_port() for _ in range(args.workers)]
                    servers = {"procs": start_servers(args, spec, ports, log, tree), "log": log}
                    servers.update(tree=tree, tree_index=index)
                    try:
                        client_loop(run_phases(args, spec, ports, [t for _, t in nodes], servers))
                    finally:
                        for proc in servers["procs"]:
                            proc.kill()
                            proc.wait()
                    time.sleep(2.0)  # the closed sockets' TIME_WAIT and the database settle between servers
        errors = [line for line in log_path.read_text().splitlines() if " ERROR " in line or "Traceback" in line]
        print(f"\nserver log {log_path}: {len(errors)} errors" + (f", first: {errors[0][:300]}" if errors else ""))
    finally:
        from django.db import connections

        connections.close_all()
        for connection in connections.all(initialized_only=True):
            connection.close_pool()
        POOL.recreate_database(args.database_url, args.db_name, drop_only=True)
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    random.seed()
    main()
