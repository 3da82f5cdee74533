"""What the benchmark scripts share: this checkout's packages on the import path, bench/pool.py's
helpers (servers, databases, nodes, the CPU of a process), a throwaway site (its own PostgreSQL, its
nodes' tokens, a daphne on it), the set-up of a subprocess that measures another source tree
(`tree_run`), the load average as they print it, and a worker process kept off the CPU as a loaded
machine would (`stall_next_worker`).

bench/pool.py is loaded by path, once: imported by its name it would be the platform's `pool` app.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: This checkout's packages, in import order: the platform's apps, then the node client.
CHECKOUT = (ROOT / "platform", ROOT / "node_client")


def use_checkout() -> None:
    """Put this checkout's platform and node client first on the import path: a benchmark measures the
    tree it is in, not an installed sapo_node."""
    for folder in reversed(CHECKOUT):
        while str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))


def checkout_pythonpath() -> str:
    """PYTHONPATH for a subprocess (a server, a node) that runs this checkout's packages."""
    return os.pathsep.join(str(folder) for folder in CHECKOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.cache
def pool_bench() -> ModuleType:
    """bench/pool.py as a module (named `bench_pool`)."""
    spec = importlib.util.spec_from_file_location("bench_pool", HERE / "pool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def load() -> str:
    """The 1-minute load average, as printed beside every figure."""
    return f"{os.getloadavg()[0]:.2f}"


@dataclass
class ThrowawaySite:
    """A site made for one run (`throwaway_site`): its folder, its PostgreSQL's URL, its nodes' tokens."""

    var: Path
    url: str
    tokens: list[str]

    def server_env(self) -> dict[str, str]:
        """The environment of a daphne serving this site: this checkout, as deployed (SAPO_DEBUG=0), no
        Redis (in-memory layer and counters), no message-rate limit in the way of the nodes."""
        env = {
            **os.environ,
            "PYTHONPATH": checkout_pythonpath(),
            "SAPO_DEBUG": "0",
            "SAPO_MAX_MESSAGES_PER_MINUTE": "1000000",
        }
        env.pop("REDIS_URL", None)
        return env

    def start_server(self, port: int, log: Path) -> subprocess.Popen:
        """daphne on 127.0.0.1:`port`, its output appended to `log`; returns once it listens."""
        with log.open("ab") as out:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "daphne",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-v",
                    "0",
                    "config.asgi:application",
                ],
                env=self.server_env(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.time() + 90
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.time() > deadline or server.poll() is not None:
                server.kill()
                raise SystemExit(f"daphne did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        return server


@contextmanager
def throwaway_site(name: str, nodes: int) -> Iterator[ThrowawaySite]:
    """A throwaway PostgreSQL (common.embedded_db's, in a temporary folder on a free port), migrated,
    with `nodes` users each owning one node named `name`-i, and this process's Django set up on it (no
    Redis). On leaving, the database is stopped and the folder removed."""
    var = Path(tempfile.mkdtemp(prefix=f"sapo-{name}-"))
    os.chmod(var, 0o755)
    os.environ.update(SAPO_VAR_DIR=str(var), SAPO_EMBEDDED_PG_PORT=str(free_port()))
    os.environ.pop("DATABASE_URL", None)
    from common import embedded_db

    url = embedded_db.ensure_running()
    try:
        os.environ.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="config.settings", SAPO_LOG_LEVEL="WARNING")
        os.environ.pop("REDIS_URL", None)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from accounts.services import user_create
        from nodes.services import node_create, node_token_issue

        call_command("migrate", verbosity=0)
        tokens = []
        for i in range(nodes):
            user = user_create(username=f"{name}{i}", display_name=f"{name} {i}", password=None)
            tokens.append(node_token_issue(node=node_create(owner=user, name=f"{name}-{i}"))[1])
        connections.close_all()
        yield ThrowawaySite(var, url, tokens)
    finally:
        embedded_db.stop()
        shutil.rmtree(var, ignore_errors=True)


def _children(pid: int) -> set[int]:
    """`pid`'s children, from Linux's /proc/<pid>/task/<tid>/children."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children |= {int(child) for child in (task / "children").read_text().split()}
        except OSError:
            pass
    return children


def descendants(pid: int) -> set[int]:
    """`pid`'s descendants (a fork server's workers are its children's children)."""
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = set().union(*map(_children, frontier)) - found
        found |= frontier
    return found


def _resident_mib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def stall_next_worker(before: set[int], seconds: float, grown_mib: int, done: threading.Event) -> int | None:
    """Stop (SIGSTOP) for `seconds` the first of this process's descendants not in `before` whose
    resident set grows by `grown_mib` (a fork server's worker in its work, not while it starts; not the
    fork server, a child of this process, which grows as it imports), as a loaded machine keeps a
    process off the CPU, then let it go on. Its pid; None when `done` was set first."""
    first: dict[int, int] = {}
    while not done.wait(0.002):
        for pid in descendants(os.getpid()) - _children(os.getpid()) - before:
            mib = _resident_mib(pid)
            if mib is None:
                continue
            if mib - first.setdefault(pid, mib) >= grown_mib:
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(seconds)
                finally:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:  # killed while stopped
                        pass
                return pid
    return None


@contextmanager
def tree_run(args: argparse.Namespace, **env: str) -> Iterator[ModuleType]:
    """The set-up of a benchmark's subprocess that measures the source tree `args.child`: that tree's
    `platform` and `node_client` first on the import path, a database of its own (`args.db_name`,
    created anew on `args.database_url`'s server and migrated with the tree's migrations), and Django
    set up on it as deployed (SAPO_DEBUG=0, warnings only, no Redis; `env` on top; the catalogue
    `args.catalogue`). Yields bench/pool.py's module; on leaving, the database is dropped."""
    # bench/pool.py puts this script's tree on the path when loaded: the measured tree goes before it.
    path = list(sys.path)
    bench_pool = pool_bench()
    sys.path[:] = [*bench_pool.tree_path(Path(args.child).resolve()), *path]
    args.bench_url = bench_pool.with_db(args.database_url, args.db_name)
    bench_pool.recreate_database(args.database_url, args.db_name)
    try:
        os.environ.update(SAPO_DEBUG="0", SAPO_LOG_LEVEL="WARNING", **env)
        os.environ.pop("REDIS_URL", None)
        bench_pool.setup_django(args)
        yield bench_pool
    finally:
        from django.db import connections

        connections.close_all()
        bench_pool.recreate_database(args.database_url, args.db_name, drop_only=True)
