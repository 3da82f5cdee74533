"""Benchmark of the pool: ingest through real WebSockets, and sampling latency as the pool grows.

    .venv/bin/python bench/pool.py                      # full run (10k and 1M groups)
    .venv/bin/python bench/pool.py --sizes 10000,100000 # quicker
    REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python bench/pool.py --workers 1,2 --skip-sample

(a) Ingest: a daphne server on a loopback port (a subprocess) and `--connections` clients (the
    `websockets` library) share honest groups (each node writes its own text: honest nodes are not
    copies of each other); every completion is re-verified by the server and
    stored in PostgreSQL. The same rows are then written again by a plain bulk insert on the same
    server (executemany, one transaction per message-sized batch, and one COPY of everything): the
    ratio of the two rates is the price of the protocol, verification and ORM.
    `--workers 1,2` runs the WebSocket ingest with one server process and with two (daphne workers
    as docs/deploy.md "Scale-out" runs them: own SAPO_SERVER_NAME each, one Redis from REDIS_URL, one
    database), the clients spread over them in turn as a round-robin proxy would: each is a path of
    its own. One worker keeps the single-process set-up (no Redis), so its row stays comparable with
    earlier figures. `--pin on` runs each worker on a core of its own and the clients on the cores
    left (docs/deploy.md, "How many workers"); `--pin both` measures every WebSocket path pinned and
    not. `--trees a,b` runs every WebSocket path's servers from each of these source trees (two
    commits compared in one run; they must share this tree's migrations). The paths are measured
    in alternation, `--rounds` times each (every round runs them all, in turn), so all see the same
    machine; every measure prints the load average at its start and end, and the ratios are printed
    only when the load average was at most 1.5 when the ingest part started (exit status 3 otherwise,
    unless --force).
(b) Sampling: the pool is filled server-side (INSERT ... SELECT generate_series) to each size, then
    `pool.sampling.rollout_sample` (what the `sample` message calls: the draw, the groups' JSON, the
    served record) is timed. With `--trees`, at one size: each tree's `rollout_sample` in a process of
    its own, on a database made with that tree's migrations, the trees timed in alternation,
    SAMPLE_BLOCK calls at a time.

Runs in its own database (`--db-name`, dropped at the end unless --keep-db) on DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from benchkit import ROOT, free_port, use_checkout

use_checkout()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_bench", help="database created (and dropped) for the run")
    parser.add_argument("--keep-db", action="store_true", help="leave the benchmark database behind")
    parser.add_argument("--connections", type=int, default=4, help="concurrent WebSocket clients (one node each)")
    parser.add_argument("--messages", type=int, default=30, help="share messages per connection")
    parser.add_argument("--groups", type=int, default=32, help="groups per share message")
    parser.add_argument("--completions", type=int, default=8, help="completions per group")
    parser.add_argument("--completion-chars", type=int, default=300, help="length of each completion's text")
    parser.add_argument("--catalogue", default="easy", choices=["easy", "sapo"])
    parser.add_argument("--conn-max-age", type=int, default=600, help="SAPO_CONN_MAX_AGE given to the server")
    parser.add_argument("--sizes", default="10000,1000000", help="pool sizes for the sampling test")
    parser.add_argument("--samples", type=int, default=500, help="timed sample calls per size")
    parser.add_argument("--n", type=int, default=8, help="groups per sample call")
    parser.add_argument(
        "--moderation",
        default="both",
        choices=["on", "off", "both"],
        help="ingest with the moderation app's automatic rules, without them, or both runs",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="server processes for the ingest, comma-separated (1,2 compares; more than 1 needs REDIS_URL)",
    )
    parser.add_argument(
        "--pin",
        default="off",
        choices=["off", "on", "both"],
        help="server workers pinned to cores of their own (docs/deploy.md), the clients to the cores left;"
        " both: each WebSocket path measured pinned and not, in alternation",
    )
    parser.add_argument(
        "--native",
        default="on",
        choices=["on", "off", "both"],
        help="a share's per-item loops in C (sapo_native, native/: the rules' text work, the statements'"
        " arrays) or in their Python and numpy twins (SAPO_NATIVE=0); both: each WebSocket path measured"
        " both ways, in alternation",
    )
    parser.add_argument(
        "--share-batch",
        default="",
        help="SAPO_SHARE_BATCH for the servers (shares of different nodes waiting at once stored together),"
        " comma-separated: each WebSocket path measured with each, in alternation (default: the server's)",
    )
    parser.add_argument(
        "--synchronous-commit",
        default="on",
        choices=["on", "off", "both"],
        help="the benchmark database's synchronous_commit (ALTER DATABASE, its own database only): on, each"
        " acknowledged group waits for the disk, as the site runs; off, a crash may lose the last acknowledged"
        " ones; both: each WebSocket path measured both ways, in alternation (what durability costs ingest)",
    )
    parser.add_argument(
        "--trees",
        default="",
        help="source trees the servers run (their platform/ and node_client/), comma-separated: each WebSocket"
        " path measured with each, in alternation (default: this one). They must share this tree's migrations"
        " (the database is made with them). Sampling (one --sizes) times each tree's own code on a database"
        " made with its own migrations",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the sampling subprocess of one of --trees
    parser.add_argument("--rounds", type=int, default=3, help="ingest: measures of each path, in alternation")
    parser.add_argument("--force", action="store_true", help=f"print ingest ratios even above load {MAX_QUIET_LOAD}")
    parser.add_argument("--skip-ingest", action="store_true")
    parser.add_argument("--skip-sample", action="store_true")
    return parser.parse_args()


#: Above this load average (1 min) at the start, the ingest ratios are not published (unless --force).
MAX_QUIET_LOAD = 1.5


def load1() -> float:
    return os.getloadavg()[0]


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def recreate_database(url: str, name: str, drop_only: bool = False, template: str | None = None) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a process from /proc (clock ticks: 10 ms resolution), None when it
    cannot be read (another machine's database, no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuMeter:
    """CPU spent between `start()` and `stop()` by the given server processes and by every PostgreSQL
    backend of the benchmark database (those born meanwhile counted whole). PostgreSQL's share reads
    /proc, so it is known only when the database runs on this machine (None otherwise)."""

    def __init__(self, args: argparse.Namespace, pids: list[int]) -> None:
        self.args, self.pids = args, pids

    def _backends(self) -> dict[int, float | None]:
        import psycopg

        with psycopg.connect(self.args.bench_url, autocommit=True) as conn:
            pids = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
        return {pid: process_cpu(pid) for pid in pids}

    def _read(self) -> tuple[float, dict[int, float | None]]:
        own = time.process_time() if not self.pids else sum(process_cpu(p) or 0.0 for p in self.pids)
        return own, self._backends()

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> None:
        """Sets `cpu`: {"client_or_server": seconds, "database": seconds or None}."""
        own, backends = self._read()
        if any(v is None for v in backends.values()):
            database = None
        else:
            database = sum(v - (self.before[1].get(pid) or 0.0) for pid, v in backends.items())
        self.cpu = {"client_or_server": own - self.before[0], "database": database}


# --- setup ------------------------------------------------------------------------------------


def setup_django(args: argparse.Namespace) -> None:
    os.environ["DATABASE_URL"] = args.bench_url
    os.environ["SAPO_CATALOGUE"] = args.catalogue
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_nodes(count: int, prefix: str) -> list[tuple[object, str]]:
    from accounts.services import user_create
    from nodes.services import node_create, node_token_issue

    out = []
    for i in range(count):
        user = user_create(username=f"{prefix}{i}", display_name=f"{prefix} {i}", password=None)
        node = node_create(owner=user, name=f"{prefix}-{i}")
        out.append((node, node_token_issue(node=node)[1]))
    return out


REASONING_WORDS = (
    "let me work through this step by step first the question asks for a value so I compute each part "
    "then check the result against the constraints carry the digit subtract multiply divide add compare "
    "count convert simplify because therefore which means so the answer should be clear now verify again "
    "looking at the numbers we see that it follows from the previous line and this gives us"
).split()


def build_frames(args: argparse.Namespace, seeds: list[int]) -> list[list[str]]:
    """Per connection, its share frames (JSON text): honest groups, half right and half wrong."""
    from sapo_node.ids import uuid7
    from sapo_node.progress import progress_bar
    from sapo_node.tasks import CATALOGUES, build_entry, score_completion

    catalogue = CATALOGUES[args.catalogue]

    def reasoning(rng: random.Random) -> str:
        # Each node writes its own reasoning: with one filler shared by every node, the same question
        # drawn by two nodes made byte-identical groups, which the duplicate rules rightly hold as copies.
        words: list[str] = []
        size = 0
        while size < args.completion_chars - 40:
            words.append(rng.choice(REASONING_WORDS))
            size += len(words[-1]) + 1
        return " ".join(words)[: max(0, args.completion_chars - 40)]

    frames: list[list[str]] = []
    total = args.connections * args.messages * args.groups
    with progress_bar(total=total, desc="building groups", unit="group", leave=False) as bar:
        for c in range(args.connections):
            rng = random.Random(seeds[c])
            mine = []
            for m in range(args.messages):
                groups = []
                for g in range(args.groups):
                    spec = catalogue.tasks[(m * args.groups + g) % len(catalogue.tasks)]
                    index = m * args.groups + g
                    entry = build_entry(spec, seeds[c], index)
                    completions = [
                        f"{reasoning(rng)} <answer>{entry['answer'] if k % 2 == 0 else 'no idea'}</answer>"
                        for k in range(args.completions)
                    ]
                    groups.append(
                        {
                            "id": str(uuid7()),
                            "round": m,
                            "task": {"dataset": spec.dataset, "seed": seeds[c], "index": index},
                            "question": entry["question"],
                            "answer": entry["answer"],
                            "completions": completions,
                            "rewards": [score_completion(spec, seeds[c], entry, x) for x in completions],
                        }
                    )
                    bar.update()
                mine.append(json.dumps({"type": "share", "v": 1, "ref": f"{c}-{m}", "rollouts": groups}))
            frames.append(mine)
    return frames


# --- (a) ingest -------------------------------------------------------------------------------


SERVER_SCRIPT = """
import sys
import django
django.setup()
if sys.argv.pop(1) == "without":  # measure the pool alone: no automatic moderation rules
    from pool.seams import NO_MODERATION, moderation_register
    moderation_register(NO_MODERATION)
from daphne.cli import CommandLineInterface
sys.argv[0] = "daphne"
CommandLineInterface.entrypoint()
"""


def tree_path(tree: Path) -> list[str]:
    """The import path of `tree`'s packages: its platform and node client, and its own `sapo_native`
    when one is built in place there (`python setup.py build_ext --inplace` in tree/native), ahead of
    the installed one: --trees then compares the C extension's changes too."""
    native = tree / "native"
    built = any((native / "sapo_native").glob("_text*.so"))
    return [str(tree / "platform"), str(tree / "node_client"), *([str(native)] if built else [])]


def server_env(
    args: argparse.Namespace, name: str, *, redis_url: str | None = None, tree: Path = ROOT
) -> dict[str, str]:
    """The environment of a benchmark's daphne server: `tree`'s packages (this tree's by default), the
    benchmark's database and catalogue, as deployed (SAPO_DEBUG=0: no debug cursor logging every
    statement), warnings-only logs, `name` in presence records; Redis at `redis_url`, or none
    (in-memory layer and counters)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(tree_path(tree)),
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=args.bench_url,
        SAPO_CATALOGUE=args.catalogue,
        SAPO_LOG_LEVEL="WARNING",
        SAPO_DEBUG="0",
        SAPO_SERVER_NAME=name,
    )
    if redis_url:
        env["REDIS_URL"] = redis_url
    else:
        env.pop("REDIS_URL", None)
    return env


def start_server(
    args: argparse.Namespace,
    port: int,
    moderation: bool,
    *,
    name: str = "bench",
    redis: bool = False,
    budgets: bool = False,
    cpu: int | None = None,
    native: bool = True,
    share_batch: int | None = None,
    tree: Path = ROOT,
) -> subprocess.Popen:
    """daphne on `port`. The per-node message rate is lifted (the benchmark's few nodes send what a
    swarm would); so are the byte and CPU budgets unless `budgets` (bench/attack.py measures them).
    `cpu`: the one core it runs on (as `taskset -c`). `native`: False runs the Python and numpy twins
    of the C extension's loops (SAPO_NATIVE=0). `share_batch`: SAPO_SHARE_BATCH (None: the default).
    `tree`: the source tree it runs (this one by default)."""
    env = server_env(args, name, redis_url=os.environ.get("REDIS_URL") if redis else None, tree=tree)
    env.update(
        SAPO_CONN_MAX_AGE=str(args.conn_max_age),
        SAPO_MAX_MESSAGES_PER_MINUTE="1000000",
        SAPO_NATIVE="1" if native else "0",
    )
    if share_batch is not None:
        env["SAPO_SHARE_BATCH"] = str(share_batch)
    if not budgets:
        env.update(SAPO_MAX_BYTES_PER_MINUTE=str(2**40), SAPO_MAX_CPU_MS_PER_MINUTE=str(2**40))
    # With Redis, several workers share it (channel layer, rate counts, presence), as deployed, under
    # the run's own SAPO_REDIS_PREFIX (set by main, inherited).
    # The first socket imports the consumer and reasoning-gym (seconds on a busy machine): allow more
    # than daphne's default 5 s handshake.
    daphne_args = ["-b", "127.0.0.1", "-p", str(port), "-v", "0", "--websocket_connect_timeout", "60"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SERVER_SCRIPT,
            "with" if moderation else "without",
            *daphne_args,
            "config.asgi:application",
        ],
        env=env,
        cwd=tree,
        preexec_fn=None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu})),
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        if proc.poll() is not None:
            raise SystemExit("daphne exited during start-up")
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("daphne did not start listening in 30 s")


async def run_clients(
    ports: list[int], tokens: list[str], frames: list[list[str]], completions: int, meter: CpuMeter | None = None
) -> tuple[float, int]:
    import websockets

    from sapo_node.progress import progress_bar

    # Connection i to worker i mod len(ports): what a round-robin proxy in front of them does.
    sockets = [
        await websockets.connect(
            f"ws://127.0.0.1:{ports[i % len(ports)]}/ws/node/",
            additional_headers={"Authorization": f"Bearer {t}"},
            max_size=None,
        )
        for i, t in enumerate(tokens)
    ]
    for ws in sockets:  # warm-up: authentication done, first DB connection open
        await ws.send(json.dumps({"type": "hello", "v": 1, "client": "bench"}))
        assert json.loads(await ws.recv())["type"] == "welcome"
    accepted = 0
    bar = progress_bar(total=sum(len(f) for f in frames), desc="sharing", unit="msg", leave=False)

    async def client(ws, mine: list[str]) -> None:
        nonlocal accepted
        for frame in mine:
            await ws.send(frame)
            reply = json.loads(await ws.recv())
            if reply.get("type") != "ack" or reply["rejected"]:
                raise SystemExit(f"unexpected reply: {str(reply)[:300]}")
            accepted += len(reply["accepted"])
            bar.update()

    if meter is not None:
        meter.start()
    start = time.perf_counter()
    await asyncio.gather(*(client(ws, mine) for ws, mine in zip(sockets, frames, strict=True)))
    elapsed = time.perf_counter() - start
    if meter is not None:
        meter.stop()
    bar.close()
    for ws in sockets:
        await ws.close()
    return elapsed, accepted * completions


ROLLOUT_COLUMNS = [
    "id",
    "node_id",
    "swarm_id",
    "catalogue_version",
    "round",
    "dataset",
    "seed",
    "index",
    "question",
    "answer",
    "completions",
    "completion_count",
    "claimed_rewards",
    "verified_rewards",
    "verdict",
    "reason",
    "moderation_status",
    "has_variance",
    "sampleable",
    "sample_seq",
    "created_at",
]


#: A group's texts are pool_rollouttext's (docs/architecture.md, "The pool's storage"); the rest is the ledger's.
TEXT_COLUMNS = ["question", "answer", "completions"]
LEDGER_COLUMNS = [c for c in ROLLOUT_COLUMNS if c not in TEXT_COLUMNS]


def stored_rows(args: argparse.Namespace) -> list[tuple]:
    """The groups a WebSocket run stored, as rows to write again (JSON columns as text)."""
    import psycopg

    json_columns = {"completions", "claimed_rewards", "verified_rewards"}
    select = ", ".join(
        f'{"t" if c in TEXT_COLUMNS else "r"}."{c}"' + ("::text" if c in json_columns else "") for c in ROLLOUT_COLUMNS
    )
    with psycopg.connect(args.bench_url) as conn:
        return conn.execute(
            f"SELECT {select} FROM pool_rollout r"
            " JOIN pool_rollouttext t ON t.rollout_id = r.id AND t.created_at = r.created_at"
        ).fetchall()


def _split(row: tuple) -> tuple[tuple, tuple]:
    """A stored group's (ledger row, texts row)."""
    named = dict(zip(ROLLOUT_COLUMNS, row, strict=True))
    texts = (named["id"], named["swarm_id"], named["created_at"], *(named[c] for c in TEXT_COLUMNS))
    return tuple(named[c] for c in LEDGER_COLUMNS), texts


def raw_insert_rate(args: argparse.Namespace, rows: list[tuple], how: str, meter: CpuMeter) -> float:
    """Completions/s writing `rows` again: `executemany` per message-sized batch (one transaction
    each), or one COPY of everything. `meter` measures this process's CPU and the database's."""
    import psycopg

    quoted = ", ".join(f'"{c}"' for c in LEDGER_COLUMNS)
    text_quoted = "rollout_id, swarm_id, created_at, " + ", ".join(TEXT_COLUMNS)
    completions = sum(r[ROLLOUT_COLUMNS.index("completion_count")] for r in rows)
    split = [_split(r) for r in rows]
    with psycopg.connect(args.bench_url) as conn:
        conn.execute("TRUNCATE pool_rollout, pool_rollouttext, moderation_rolloutfingerprint CASCADE")
        conn.commit()
        meter.start()
        start = time.perf_counter()
        if how == "executemany":
            placeholders = ", ".join(["%s"] * len(LEDGER_COLUMNS))
            with conn.cursor() as cur:
                for i in range(0, len(rows), args.groups):
                    batch = split[i : i + args.groups]
                    cur.executemany(
                        f"INSERT INTO pool_rollout ({quoted}) VALUES ({placeholders})", [b[0] for b in batch]
                    )
                    cur.executemany(
                        f"INSERT INTO pool_rollouttext ({text_quoted}) VALUES (%s, %s, %s, %s, %s, %s)",
                        [b[1] for b in batch],
                    )
                    conn.commit()
        else:
            with conn.cursor() as cur:
                with cur.copy(f"COPY pool_rollout ({quoted}) FROM STDIN") as copy:
                    for ledger, _ in split:
                        copy.write_row(ledger)
                with cur.copy(f"COPY pool_rollouttext ({text_quoted}) FROM STDIN") as copy:
                    for _, texts in split:
                        copy.write_row(texts)
            conn.commit()
        elapsed = time.perf_counter() - start
        meter.stop()
        return completions / elapsed


RAW_LABELS = {"executemany": "executemany, one transaction per message", "COPY": "COPY, one transaction"}


def share_path(
    moderation: str,
    workers: int,
    pinned: bool = False,
    native: bool = True,
    batch: int | None = None,
    tree: int | None = None,
    durable: bool = True,
) -> str:
    """A WebSocket ingest path: "with" or "without" moderation rules, on `workers` server processes,
    pinned to cores of their own or not, with the C extension's loops or their twins, with the
    servers' SAPO_SHARE_BATCH or `batch`, running this tree or the `tree`-th of --trees, with commits
    that wait for the disk (`durable`) or not."""
    return (
        f"{moderation}/{workers}"
        + ("/pinned" if pinned else "")
        + ("" if native else "/numpy")
        + ("" if batch is None else f"/batch{batch}")
        + ("" if tree is None else f"/tree{tree}")
        + ("" if durable else "/async-commit")
    )


def path_tree(rest: list[str]) -> int | None:
    """The --trees index of a share path's remaining parts (None: this tree)."""
    return next((int(part.removeprefix("tree")) for part in rest if part.startswith("tree")), None)


def server_trees(args: argparse.Namespace) -> list[Path]:
    """--trees, resolved (empty: the servers run this tree)."""
    return [Path(t).resolve() for t in args.trees.split(",")] if args.trees else []


def path_batch(rest: list[str]) -> int | None:
    """The SAPO_SHARE_BATCH of a share path's remaining parts (None: the server's default)."""
    return next((int(part.removeprefix("batch")) for part in rest if part.startswith("batch")), None)


def path_label(path: str, trees: list[Path] | None = None) -> str:
    if path in RAW_LABELS:
        return RAW_LABELS[path]
    moderation, workers, *rest = path.split("/")
    label = f"WebSocket share, {moderation} moderation rules, {workers} worker{'s' * (int(workers) > 1)}"
    label += (", pinned" if "pinned" in rest else "") + (", without C (SAPO_NATIVE=0)" if "numpy" in rest else "")
    label += ", synchronous_commit off" if "async-commit" in rest else ""
    batch = path_batch(rest)
    if batch is not None:
        label += ", shares alone" if batch == 1 else f", up to {batch} shares together"
    tree = path_tree(rest)
    if tree is not None:
        label += f", tree {tree}" + (f" ({trees[tree]})" if trees else "")
    return label


def set_synchronous_commit(args: argparse.Namespace, value: str) -> None:
    """The benchmark database's default for the sessions its servers open next (never the server's)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                sql.Identifier(args.db_name), sql.Literal(value)
            )
        )


def pinned_cores(workers: int) -> tuple[list[int], set[int]]:
    """Where a pinned measure runs: worker i alone on the i-th core from the end of this process's
    cores, the clients (this process) on the cores left, or on all of them when the workers take every
    core. PostgreSQL is left to the scheduler (a deployment pins it as a service of its own)."""
    cores = sorted(os.sched_getaffinity(0))
    mine = [cores[-1 - i % len(cores)] for i in range(workers)]
    return mine, set(cores) - set(mine) or set(cores)


def bench_ingest(args: argparse.Namespace) -> dict:
    """Every path `args.rounds` times, in alternation (the order reversed every other round), each
    measure with the load average at its start and end. The raw paths write the rows the first
    WebSocket measure stored."""
    from pool.models import NodeStorageHour, Rollout

    nodes = make_nodes(args.connections, "ingest")
    frames = build_frames(args, seeds=[1000 + i for i in range(args.connections)])
    expected = args.connections * args.messages * args.groups
    moderations = {"both": ["with", "without"], "on": ["with"], "off": ["without"]}[args.moderation]
    pins = {"off": [False], "on": [True], "both": [False, True]}[args.pin]
    natives = {"on": [True], "off": [False], "both": [True, False]}[args.native]
    batches = [int(b) for b in args.share_batch.split(",")] if args.share_batch else [None]
    durables = {"on": [True], "off": [False], "both": [True, False]}[args.synchronous_commit]
    trees = server_trees(args)
    for tree in trees:
        if not (tree / "platform" / "config" / "asgi.py").is_file():
            raise SystemExit(f"--trees: {tree} holds no platform/config/asgi.py")
    shares = [
        share_path(m, w, p, n, b, t, d)
        for m in moderations
        for w in args.worker_counts
        for p in pins
        for n in natives
        for b in batches
        for t in (range(len(trees)) if trees else [None])
        for d in durables
    ]
    paths = [*shares, "executemany", "COPY"]
    measures: dict[str, list[dict]] = {p: [] for p in paths}
    rows: list[tuple] = []
    load_at_start = load1()
    for r in range(args.rounds):
        order = paths if r % 2 == 0 else paths[::-1]
        if not rows:  # the raw paths need the rows a WebSocket measure stores
            order = sorted(order, key=lambda p: p not in shares)
        for path in order:
            if path in shares:
                Rollout.objects.all().delete()  # the same groups again, as new
                # ... by nodes that have stored nothing this hour: the measures of a long run (7 rounds
                # of four paths) would pass a node's hourly storage budget, 64 MiB, and be refused.
                NodeStorageHour.objects.all().delete()
                moderation, workers, *rest = path.split("/")
                set_synchronous_commit(args, "off" if "async-commit" in rest else "on")
                pinned = "pinned" in rest
                ports = [free_port() for _ in range(int(workers))]
                everywhere = os.sched_getaffinity(0)
                cpus, clients = pinned_cores(int(workers)) if pinned else ([None] * int(workers), everywhere)
                servers = [
                    start_server(
                        args,
                        port,
                        moderation == "with",
                        name=f"bench-{i + 1}",
                        redis=int(workers) > 1,
                        cpu=cpus[i],
                        native="numpy" not in rest,
                        share_batch=path_batch(rest),
                        tree=ROOT if (tree := path_tree(rest)) is None else trees[tree],
                    )
                    for i, port in enumerate(ports)
                ]
                meter = CpuMeter(args, [server.pid for server in servers])
                os.sched_setaffinity(0, clients)
                # The cores as the kernel holds them (read back, not as asked), printed with the figures.
                placement = {
                    "workers": [sorted(os.sched_getaffinity(server.pid)) for server in servers],
                    "clients": sorted(os.sched_getaffinity(0)),
                }
                try:
                    l0 = load1()
                    elapsed, verified = asyncio.run(
                        run_clients(ports, [t for _, t in nodes], frames, args.completions, meter)
                    )
                finally:
                    os.sched_setaffinity(0, everywhere)
                    for server in servers:
                        server.terminate()
                    for server in servers:
                        server.wait(timeout=10)
                stored = Rollout.objects.count()
                if stored != expected:
                    raise SystemExit(f"{stored} groups stored, expected {expected}")
                rate = verified / elapsed
                rows = rows or stored_rows(args)
            else:
                l0 = load1()
                placement = None
                meter = CpuMeter(args, [])
                rate = raw_insert_rate(args, rows, path, meter)
            measures[path].append(
                {"round": r, "rate": rate, "load": (l0, load1()), "cpu": meter.cpu, "placement": placement}
            )
    completions = sum(row[ROLLOUT_COLUMNS.index("completion_count")] for row in rows)
    return {"measures": measures, "completions": completions, "load_at_start": load_at_start}


def print_ingest(args: argparse.Namespace, ingest: dict) -> bool:
    """Print every measure, then the medians and ratios; False when the ratios are withheld (load)."""
    measures = ingest["measures"]
    trees = server_trees(args)
    print(
        f"\n(a) ingest: {args.connections} WebSocket connections x {args.messages} messages x {args.groups} groups"
        f" x {args.completions} completions of ~{args.completion_chars} chars ({args.catalogue} catalogue);"
        f" {args.rounds} rounds, paths in alternation; load average at start {ingest['load_at_start']:.2f}"
    )
    per = 1e6 / ingest["completions"]  # seconds of a measure -> microseconds per completion

    def cpu(m: dict, key: str) -> str:
        return "n/a" if m["cpu"][key] is None else f"{m['cpu'][key] * per:.1f}"

    print(
        "| path | round | verified completions/s | CPU us/completion: server (WebSocket) or client (raw)"
        " | PostgreSQL | load start-end |\n|---|---:|---:|---:|---:|---|"
    )
    for path, ms in measures.items():
        for m in ms:
            print(
                f"| {path_label(path, trees)} | {m['round'] + 1} | {m['rate']:,.0f} | {cpu(m, 'client_or_server')}"
                f" | {cpu(m, 'database')} | {m['load'][0]:.2f}-{m['load'][1]:.2f} |"
            )
    for path, ms in measures.items():
        if "/pinned" in path and ms:
            where = ms[0]["placement"]
            print(
                f"{path_label(path, trees)}: workers on cores {where['workers']}, clients on cores {where['clients']}"
            )
    print(
        f"({ingest['completions']:,} completions per measure; CPU from /proc, 10 ms ticks: the WebSocket"
        " paths' clients are not counted, the raw paths' are, as they are the work)"
    )
    quiet = ingest["load_at_start"] <= MAX_QUIET_LOAD
    if not quiet and not args.force:
        print(
            f"WARNING: load average {ingest['load_at_start']:.2f} > {MAX_QUIET_LOAD} when ingest started: ratios"
            " not published; rerun on a quiet machine, or pass --force to print them anyway",
            file=sys.stderr,
        )
        return False

    def rate(path: str, r: int) -> float:
        return next(m["rate"] for m in measures[path] if m["round"] == r)

    forced = "" if quiet else f" [taken at load {ingest['load_at_start']:.2f} > {MAX_QUIET_LOAD}: --force]"
    print(f"\nmedians over the rounds (each ratio taken within its round){forced}")
    print(
        "| path | verified completions/s | / executemany | / COPY | CPU us/completion (process + PostgreSQL) |"
        "\n|---|---:|---:|---:|---:|"
    )
    for path in measures:
        if path in ("executemany", "COPY"):
            ratios = ("1.00", "") if path == "executemany" else ("", "1.00")
        else:
            ratios = tuple(
                f"{statistics.median(rate(path, r) / rate(raw, r) for r in range(args.rounds)):.2f}"
                for raw in ("executemany", "COPY")
            )
        median = statistics.median(m["rate"] for m in measures[path])
        totals = [m["cpu"]["client_or_server"] + (m["cpu"]["database"] or 0.0) for m in measures[path]]
        total = (
            "n/a"
            if any(m["cpu"]["database"] is None for m in measures[path])
            else f"{statistics.median(totals) * per:.1f}"
        )
        print(f"| {path_label(path, trees)} | {median:,.0f} | {ratios[0]} | {ratios[1]} | {total} |")
    return True


# --- (b) sampling -----------------------------------------------------------------------------

FILL_SQL = """
WITH ledger AS (
INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, created_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(%(tag)s || g::text), 1, 3) || '8' || substr(md5(%(tag)s || g::text), 4, 15))::uuid,
       (%(authors)s)[1 + g %% cardinality(%(authors)s)], %(swarm)s, 1,
       g / 100, 'basic_arithmetic', 7, g,
       4, '[1, 0, 0, 0]'::jsonb, '[1, 0, 0, 0]'::jsonb,
       'accepted', '', 'ok',
       (g %% 5 <> 0), (g %% 5 <> 0),
       CASE WHEN g %% 5 <> 0 THEN nextval(%(sequence)s::regclass) END,
       at
FROM generate_series(%(start)s, %(stop)s) AS g,
     LATERAL (SELECT now() - make_interval(secs => (%(size)s - g) * %(spacing)s) AS at) AS t
RETURNING id, swarm_id, created_at, index
)
INSERT INTO pool_rollouttext (rollout_id, swarm_id, created_at, question, answer, completions)
SELECT id, swarm_id, created_at, 'What is ' || index::text || ' + 1? Give the answer in <answer> tags.',
       (index + 1)::text,
       '["<answer>1</answer>", "<answer>2</answer>", "I think <answer>3</answer>", "<answer>4</answer>"]'::jsonb
FROM ledger
"""


def fill_pool(size: int, authors: list[int], window: int) -> None:
    """Fill the pool with `size` groups: a fifth zero-variance, one author in twenty is the asker,
    created oldest first over 1.1 windows (so the oldest tenth is stale), each with a UUIDv7 id of its
    time (sapo_node.ids, written in SQL)."""
    from django.db import connection

    from sapo_node.progress import progress_bar
    from swarms.services import swarm_default_ensure

    swarm = swarm_default_ensure()  # the groups are the default swarm's, where a plain sample draws
    spacing = window * 1.1 / size
    step = 100_000
    with progress_bar(total=size, desc=f"filling to {size:,}", unit="group", leave=False) as bar:
        for start in range(0, size, step):
            stop = min(size, start + step) - 1
            with connection.cursor() as cur:
                cur.execute(
                    FILL_SQL,
                    {
                        "swarm": swarm.id,
                        "sequence": swarm.sample_sequence,
                        "tag": f"s{size}",
                        "authors": authors,
                        "size": size,
                        "spacing": spacing,
                        "start": start,
                        "stop": stop,
                    },
                )
            bar.update(stop - start + 1)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE pool_rollout")
        cur.execute("VACUUM ANALYZE pool_rollouttext")


def timed_sample(asker: object, n: int, window: int, swarm_id: int) -> tuple[float, int]:
    """One `sample` of `n` by `asker`: its milliseconds and the groups it got (never the asker's own)."""
    from pool.sampling import rollout_sample

    t0 = time.perf_counter()
    drawn = rollout_sample(node=asker, n=n, window_seconds=window, swarm_id=swarm_id)
    ms = (time.perf_counter() - t0) * 1000
    rows = [json.loads(text) for text in drawn.texts]
    if any(r["node"] == asker.name for r in rows):
        raise SystemExit("sampled the asker's own group")
    return ms, len(rows)


def bench_sampling(args: argparse.Namespace) -> list[dict[str, float]]:
    """One database per pool size (copies of the benchmark database), filled, then timed in
    alternation: call i goes to every size in turn, so each size sees the same machine load."""
    from django.conf import settings
    from django.db import connections

    from pool.models import Rollout
    from pool.sampling import rollout_sample
    from sapo_node.progress import progress_bar
    from swarms.services import swarm_default_ensure

    window = 86_400
    nodes = make_nodes(20, "author")
    asker = nodes[0][0]
    authors = [n.id for n, _ in nodes]
    sizes = sorted(int(s) for s in args.sizes.split(","))
    default = connections["default"]
    default.close()
    default.close_pool()  # the copies are made from this database: no session of ours may stay on it
    aliases = {}
    for size in sizes:
        alias = f"pool{size}"
        recreate_database(args.database_url, f"{args.db_name}_{alias}", template=args.db_name)
        settings.DATABASES[alias] = {**settings.DATABASES["default"], "NAME": f"{args.db_name}_{alias}"}
        aliases[size] = alias
    args.extra_dbs = [settings.DATABASES[a]["NAME"] for a in aliases.values()]
    fill_s = {}
    try:
        for size, alias in aliases.items():
            connections["default"] = connections[alias]
            start = time.perf_counter()
            with connections[alias].cursor() as cur:
                cur.execute("TRUNCATE pool_rollout, pool_rollouttext, moderation_rolloutfingerprint CASCADE")
            fill_pool(size, authors, window)
            fill_s[size] = time.perf_counter() - start
            assert Rollout.objects.count() == size
            swarm_id = swarm_default_ensure().id  # the same in every copy of the template database
            for _ in range(20):  # warm caches and the connection
                rollout_sample(node=asker, n=args.n, window_seconds=window, swarm_id=swarm_id)
        timings: dict[int, list[float]] = {size: [] for size in sizes}
        got = dict.fromkeys(sizes, 0)
        load_start = load1()
        for _ in progress_bar(range(args.samples), desc=f"sampling {args.sizes}", unit="round", leave=False):
            for size, alias in aliases.items():
                connections["default"] = connections[alias]
                ms, groups = timed_sample(asker, args.n, window, swarm_id)
                timings[size].append(ms)
                got[size] += groups
        load_end = load1()
    finally:
        connections["default"] = default
        for alias in aliases.values():
            connections[alias].close()
    load = f"{load_start:.2f}-{load_end:.2f}"
    return [latencies(size, fill_s[size], timings[size], got[size], load) for size in sizes]


def latencies(size: int, fill_s: float, ms: list[float], got: int, load: str) -> dict:
    """A row of the sampling table: the calls' milliseconds `ms` summed up, with the groups they got."""
    ts = sorted(ms)
    p99 = ts[min(len(ts) - 1, int(len(ts) * 0.99))]
    return {
        "size": size,
        "fill_s": fill_s,
        "p50": statistics.median(ts),
        "p99": p99,
        "mean": statistics.fmean(ts),
        "load": load,
        "per_call": got / len(ts),
    }


#: With --trees, the sampling's calls go to each tree's process this many at a time, in alternation.
SAMPLE_BLOCK = 10
#: The start of a sampling child's replies on its standard output.
CHILD_MARK = "@@sample "


def sample_child(args: argparse.Namespace) -> None:
    """--child TREE: the sampling part for one of --trees, in that tree's code (benchkit.tree_run: its
    platform first on the path, a database of its own made with its migrations): the pool filled to
    --sizes, then for each line K read, K timed calls, answered as one line of milliseconds."""
    from benchkit import tree_run

    with tree_run(args):
        from pool.sampling import rollout_sample
        from swarms.services import swarm_default_ensure

        window = 86_400
        nodes = make_nodes(20, "author")
        asker = nodes[0][0]
        started = time.perf_counter()
        fill_pool(int(args.sizes), [n.id for n, _ in nodes], window)
        fill_s = time.perf_counter() - started
        swarm_id = swarm_default_ensure().id
        for _ in range(20):  # warm caches and the connection
            rollout_sample(node=asker, n=args.n, window_seconds=window, swarm_id=swarm_id)
        print(CHILD_MARK + json.dumps({"fill_s": fill_s}), flush=True)
        for line in sys.stdin:
            timings, got = [], 0
            for _ in range(int(line)):
                ms, groups = timed_sample(asker, args.n, window, swarm_id)
                timings.append(ms)
                got += groups
            print(CHILD_MARK + json.dumps({"ms": timings, "got": got}), flush=True)


def child_reply(child: subprocess.Popen) -> dict:
    for line in child.stdout:
        if line.startswith(CHILD_MARK):
            return json.loads(line[len(CHILD_MARK) :])
    raise SystemExit(f"a sampling child exited ({child.wait()})")


def bench_sampling_trees(args: argparse.Namespace) -> list[dict]:
    """--trees: one sampling child per tree (sample_child), filled one after the other, then timed in
    alternation, SAMPLE_BLOCK calls at a time, the order reversed every other block; the ratios of
    each block's median to the first tree's say how much the load moved them."""
    trees = server_trees(args)
    if "," in args.sizes:
        raise SystemExit("--trees with sampling: one --sizes")
    children, fill_s = [], []
    try:
        for i, tree in enumerate(trees):
            argv = ["--child", str(tree), "--db-name", f"{args.db_name}_tree{i}", "--database-url", args.database_url]
            argv += ["--catalogue", args.catalogue, "--sizes", args.sizes, "--n", str(args.n)]
            children.append(
                subprocess.Popen(
                    [sys.executable, __file__, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                )
            )
            fill_s.append(child_reply(children[-1])["fill_s"])
        timings: list[list[float]] = [[] for _ in trees]
        blocks: list[list[float]] = [[] for _ in trees]
        got = [0] * len(trees)
        load_start = load1()
        for b, first in enumerate(range(0, args.samples, SAMPLE_BLOCK)):
            for i in range(len(trees)) if b % 2 == 0 else reversed(range(len(trees))):
                children[i].stdin.write(f"{min(SAMPLE_BLOCK, args.samples - first)}\n")
                children[i].stdin.flush()
                reply = child_reply(children[i])
                timings[i] += reply["ms"]
                blocks[i].append(statistics.median(reply["ms"]))
                got[i] += reply["got"]
        load_end = load1()
    finally:
        for child in children:
            child.stdin.close()  # the child leaves its loop and drops its database
        for child in children:
            child.wait(timeout=120)
    load = f"{load_start:.2f}-{load_end:.2f}"
    return [
        {
            **latencies(int(args.sizes), fill_s[i], timings[i], got[i], load),
            "tree": f"tree {i} ({tree})",
            "block_ratios": sorted(b / b0 for b, b0 in zip(blocks[i], blocks[0], strict=True)),
        }
        for i, tree in enumerate(trees)
    ]


def main() -> None:
    args = parse_args()
    if args.child:
        return sample_child(args)
    args.worker_counts = [int(w) for w in args.workers.split(",")]
    if any(w < 1 for w in args.worker_counts):
        raise SystemExit("--workers: counts of at least 1")
    if max(args.worker_counts) > 1 and not os.environ.get("REDIS_URL") and not args.skip_ingest:
        raise SystemExit("more than one worker needs REDIS_URL (they share the channel layer, rate counts, presence)")
    args.bench_url = with_db(args.database_url, args.db_name)
    recreate_database(args.database_url, args.db_name)
    # With REDIS_URL, the abuse-limit counters (node creations per account) live in Redis: an earlier
    # run's must not count (account ids repeat in each run's new database).
    os.environ["SAPO_REDIS_PREFIX"] = f"sapobench{os.getpid()}"
    try:
        setup_django(args)
        ingest = None if args.skip_ingest else bench_ingest(args)
        if args.skip_sample:
            sampling = []
        else:
            sampling = bench_sampling_trees(args) if args.trees else bench_sampling(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            for name in [args.db_name, *getattr(args, "extra_dbs", [])]:
                recreate_database(args.database_url, name, drop_only=True)

    print(f"\nPool benchmark ({os.cpu_count()} CPUs; PostgreSQL at {urlsplit(args.database_url).hostname})")
    published = print_ingest(args, ingest) if ingest else True
    if sampling:
        print(
            f"\n(b) sample latency, n={args.n}, {args.samples} calls per size, "
            + (f"trees in alternation, {SAMPLE_BLOCK} calls at a time" if args.trees else "sizes in alternation")
            + " (selector + JSON payload)"
        )
        print(
            "| groups in pool | fill (s) | p50 (ms) | p99 (ms) | mean (ms) | groups per call | load start-end |\n"
            "|---:|---:|---:|---:|---:|---:|---|"
        )
        for r in sampling:
            print(
                f"| {r['size']:,}{', ' + r['tree'] if 'tree' in r else ''} | {r['fill_s']:.1f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['mean']:.2f} | {r['per_call']:.1f}"
                f" | {r['load']} |"
            )
        if args.trees:
            for r in sampling[1:]:
                q = statistics.quantiles(r["block_ratios"], n=4) if len(r["block_ratios"]) > 1 else [1.0] * 3
                print(
                    f"{r['tree']} / tree 0: p50 {r['p50'] / sampling[0]['p50']:.2f}, p99"
                    f" {r['p99'] / sampling[0]['p99']:.2f}, mean {r['mean'] / sampling[0]['mean']:.2f}; block medians"
                    f" ({SAMPLE_BLOCK} calls each, {len(r['block_ratios'])} blocks): median ratio {q[1]:.2f},"
                    f" quartiles {q[0]:.2f}-{q[2]:.2f}"
                )
        elif len(sampling) > 1:
            print(f"p99 ratio largest/smallest: {sampling[-1]['p99'] / sampling[0]['p99']:.2f}")
    print(f"\nload average at end {load1():.2f}")
    if not published:
        sys.exit(3)


if __name__ == "__main__":
    main()
