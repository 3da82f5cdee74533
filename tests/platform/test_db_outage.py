"""PostgreSQL down and back under a running server: a node socket opened during the outage is closed
with 4503 within the pool's timeout, seen on the wire by a real client, and once the database is back
the site serves within a few seconds (the pool's reconnection attempts are capped, config.pg_backend).

The test runs its own PostgreSQL (common.embedded_db in a temporary folder, on a free port) and its own
daphne process pointed at it: it never touches the shared database server.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from common import embedded_db

ROOT = Path(__file__).resolve().parents[2]
POOL_TIMEOUT = 6.0
#: psycopg_pool's own waits between attempts are 1, 2, 4, 8, 16, 32 s: back after 35 s, its next
#: attempt would come about 28 s later.
OUTAGE_SECONDS = 35.0
SOCKETS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def own_postgres(monkeypatch):
    """A PostgreSQL of this test's own, migrated, with one node token: (url, port, token). Its folder is
    not under pytest's temporary folder, which a concurrent pytest run as root makes private (the server
    runs as its own user then)."""
    var = Path(tempfile.mkdtemp(prefix="sapo-db-outage-"))
    var.chmod(0o755)
    port = _free_port()
    monkeypatch.setenv("SAPO_VAR_DIR", str(var))
    monkeypatch.setenv("SAPO_EMBEDDED_PG_PORT", str(port))
    url = embedded_db.ensure_running()
    try:
        env = _env(url)
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
        out = subprocess.run(
            [sys.executable, "manage.py", "sapo_node_token", "outage", "laptop"],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        yield url, port, out.strip().splitlines()[-1].strip()
    finally:
        embedded_db.stop()
        shutil.rmtree(var, ignore_errors=True)


def _env(url: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT / "node_client")]),
        "SAPO_DEBUG": "0",
        "SAPO_DB_POOL_TIMEOUT": str(POOL_TIMEOUT),
        "SAPO_DB_POOL_SIZE": "3",  # every connection of the pool is soon a reconnection attempt
        "SAPO_SHARE_SLOTS": "1",
        "SAPO_LOG_LEVEL": "WARNING",
    }
    env.pop("REDIS_URL", None)  # the server's channel layer and counters in process: nothing shared
    return env


@pytest.fixture
def server(own_postgres, tmp_path):
    url, _, _ = own_postgres
    port = _free_port()
    with open(tmp_path / "server.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            env=_env(url),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and process.poll() is None, "daphne did not start"
            time.sleep(0.2)
        yield f"ws://127.0.0.1:{port}/ws/node/"
    finally:
        process.terminate()
        process.wait(30)


async def _open(url: str, token: str) -> tuple[str, float]:
    """Open a node socket and say hello: ("welcome", seconds) or ("close <code>", seconds)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    started = time.monotonic()
    try:
        async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=60) as ws:
            await ws.send(json.dumps({"type": "hello", "v": 1, "client": "test", "model": "m", "hardware": "h"}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 60))
            return reply["type"], time.monotonic() - started
    except ConnectionClosed as exc:
        return f"close {exc.rcvd.code if exc.rcvd else None}", time.monotonic() - started


def _database_answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def test_a_socket_during_an_outage_gets_4503_and_the_site_serves_soon_after_the_database_is_back(own_postgres, server):
    url, port, token = own_postgres
    assert asyncio.run(_open(server, token))[0] == "welcome"

    embedded_db._pg("pg_ctl", ["-w", "-t", "60", "-m", "immediate", "stop"])  # a crash: every session ends
    down_at = time.monotonic()

    async def several() -> list[tuple[str, float]]:
        return await asyncio.gather(*(_open(server, token) for _ in range(SOCKETS)))

    opened = asyncio.run(several())
    assert all(answer == "close 4503" and seconds < POOL_TIMEOUT + 5 for answer, seconds in opened), opened

    # The pool keeps trying while the database is down (its waits between attempts grow).
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
    embedded_db.start_on(port)
    while not _database_answers(url):
        time.sleep(0.05)
    back_at = time.monotonic()
    answers = []
    while True:
        answer, _ = asyncio.run(_open(server, token))
        answers.append(answer)
        if answer == "welcome":
            break
        assert time.monotonic() - back_at < 60, answers
    serves_after = time.monotonic() - back_at
    print(f"\ndown {back_at - down_at:.1f} s; serving again {serves_after:.1f} s after the database was back")
    assert serves_after < 5, (serves_after, answers)


def test_the_embedded_database_commits_to_disk_and_bookkeeping_does_not(own_postgres):
    """An acknowledged group is stored for good: the embedded server runs with synchronous_commit on
    (a crash of a server with it off lost acknowledged groups); bookkeeping turns it off for itself."""
    url, _, _ = own_postgres
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
