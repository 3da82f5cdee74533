"""The real platform for a study: PostgreSQL, a pool per run, and the /ws/node/ endpoint served by
daphne from the repository checkout (the node client package alone has no server).

Pools must not mix between runs, so every (configuration, seed) run gets a fresh database and a
fresh server process: the schema is migrated once into a template database, the study's nodes and
their tokens are provisioned there too, and each run's database is a `CREATE DATABASE ... TEMPLATE`
copy of it (a file copy: well under a second). The run's daphne listens on a free loopback port
and is stopped, and its database dropped, when the run ends.

PostgreSQL is the server at `database_url` (or DATABASE_URL) when given, where the study creates
and drops its own databases (sapo_exp_<id>_*); otherwise the platform's embedded PostgreSQL,
started with `manage.py sapo_db start` (it keeps running afterwards, as it does for the platform).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

#: The checkout that contains this package: <root>/research/server.py.
DEFAULT_ROOT = Path(__file__).resolve().parents[1]

#: Contributor that owns the study's nodes in every run database.
USERNAME = "experiment"

#: The study's nodes are its own, trusted and fast: the per-node message budget is raised so a
#: node answering quickly never meets the public rate limit. Every other limit keeps its default.
SERVER_ENV = {"SAPO_MAX_MESSAGES_PER_MINUTE": "100000", "SAPO_DEBUG": "0", "PYTHONUNBUFFERED": "1"}


class PlatformError(RuntimeError):
    pass


def check_root(root: Path) -> Path:
    root = Path(root).resolve()
    if not (root / "manage.py").is_file() or not (root / "platform" / "pool").is_dir():
        raise PlatformError(
            f"{root} is not a SAPO Swarm checkout (manage.py and platform/pool/ are needed): the experiment "
            "serves the real pool from the repository; give --platform-root"
        )
    return root


def with_database(url: str, name: str) -> str:
    """`url` with its database name replaced by `name`."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Platform:
    root: Path
    catalogue: str
    log_dir: Path
    database_url: str = ""
    python: str = sys.executable
    study_id: str = field(default_factory=lambda: secrets.token_hex(3))
    admin_url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    _databases: list[str] = field(default_factory=list)
    _server: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.root = check_root(self.root)
        self.log_dir = Path(self.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ processes
    def _env(self, database_url: str | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        pythonpath = [str(self.root / "platform"), str(self.root / "node_client")]
        if env.get("PYTHONPATH"):
            pythonpath.append(env["PYTHONPATH"])
        env.update(
            SERVER_ENV,
            PYTHONPATH=os.pathsep.join(pythonpath),
            SAPO_CATALOGUE=self.catalogue,
            DJANGO_SETTINGS_MODULE="config.settings",
        )
        if database_url:
            env["DATABASE_URL"] = database_url
        return env

    def manage(self, *args: str, database_url: str | None = None, timeout: float = 300) -> str:
        """Run `manage.py ARGS` in the checkout; returns stdout, raises PlatformError on failure."""
        cmd = [self.python, str(self.root / "manage.py"), *args]
        result = subprocess.run(
            cmd,
            cwd=self.root,
            env=self._env(database_url),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        with (self.log_dir / "manage.log").open("a") as log:
            log.write(f"$ manage.py {' '.join(args)}\n{result.stdout}{result.stderr}\n")
        if result.returncode != 0:
            raise PlatformError(f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-2000:]}")
        return result.stdout

    # ------------------------------------------------------------------ the database server
    def _sql(self, statement: str) -> None:
        import psycopg  # the platform's driver: present wherever the platform's requirements are

        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(statement)

    def _start_postgres(self) -> None:
        url = self.database_url or os.environ.get("DATABASE_URL", "")
        if not url:
            out = self.manage("sapo_db", "start").strip().splitlines()
            url = out[-1].split("running:", 1)[-1].strip() if out else ""
            if not url.startswith("postgres"):
                raise PlatformError(f"manage.py sapo_db start did not report a database URL: {out!r}")
            url = with_database(url, "postgres")
        self.admin_url = url

    def _name(self, suffix: str) -> str:
        return f"sapo_exp_{self.study_id}_{suffix}"

    @contextlib.contextmanager
    def session(self, node_names: list[str]) -> Iterator[Platform]:
        """PostgreSQL up, the template database migrated with the nodes and their tokens; on exit
        every database of the study is dropped."""
        self._start_postgres()
        template = self._name("template")
        try:
            self._sql(f'CREATE DATABASE "{template}"')
            self._databases.append(template)
            template_url = with_database(self.admin_url, template)
            self.manage("migrate", "--no-input", "-v", "0", database_url=template_url)
            self.tokens = self._provision(node_names, template_url)
            yield self
        finally:
            for name in reversed(self._databases):
                with contextlib.suppress(Exception):
                    self._sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._databases.clear()

    def _provision(self, node_names: list[str], database_url: str) -> dict[str, str]:
        """One manage.py call: node_provision (what `manage.py sapo_node_token` runs) per node."""
        script = (
            "import json\nfrom nodes.services import node_provision\n"
            f"names = {json.dumps(node_names)}\n"
            f"tokens = {{n: node_provision(username={USERNAME!r}, node_name=n, model_id='experiment')[1] for n in names}}\n"
            "print(json.dumps(tokens))\n"
        )
        out = self.manage("shell", "-c", script, database_url=database_url)
        tokens = json.loads(out.strip().splitlines()[-1])
        if sorted(tokens) != sorted(node_names):
            raise PlatformError("token provisioning returned other nodes than asked")
        return tokens

    def serving(self) -> bool:
        """Whether the current run's server process is alive."""
        return self._server is not None and self._server.poll() is None

    # ------------------------------------------------------------------ one run
    @contextlib.contextmanager
    def run(self, label: str) -> Iterator[str]:
        """A fresh pool (database copied from the template) served by a fresh daphne; yields the
        WebSocket URL of /ws/node/. Stops the server and drops the database on exit."""
        name = self._name(label)
        self._sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._sql(f'CREATE DATABASE "{name}" TEMPLATE "{self._name("template")}"')
        self._databases.append(name)
        try:
            with self.serve(with_database(self.admin_url, name), self.log_dir / f"server-{label}.log") as url:
                yield url
        finally:
            with contextlib.suppress(Exception):
                self._sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                self._databases.remove(name)

    @contextlib.contextmanager
    def serve(self, database_url: str, log_path: Path, timeout: float = 90.0) -> Iterator[str]:
        port = free_port()
        cmd = [self.python, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
        with open(log_path, "a") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=self.root / "platform",
                env=self._env(database_url),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._server = proc
        try:
            _wait_listening(proc, port, timeout, log_path)
            yield f"ws://127.0.0.1:{port}/ws/node/"
        finally:
            self._server = None
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def _wait_listening(proc: subprocess.Popen, port: int, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PlatformError(f"daphne exited with {proc.returncode}; see {log_path}:\n{_tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise PlatformError(f"daphne did not listen on port {port} within {timeout:.0f} s; see {log_path}")


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text()[-chars:]
    except OSError:
        return ""
