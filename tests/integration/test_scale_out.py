"""Scale-out (docs/deploy.md, "Scale-out"): two daphne processes started as a user starts
them (`daphne config.asgi:application`, each with its own SAPO_SERVER_NAME and port), on one Redis
and one PostgreSQL database, with node sockets on each:

- counts agree whichever worker served the share: the pool's statistics, the leaderboard and
  /metrics (database gauges, and counters summed over both in multiprocess mode) are the same
  answered by either worker;
- a ban a moderator makes on one worker (logged in on the other: no sticky sessions) closes the
  node's sockets on both workers with 4403, through the channel layer in Redis;
- a worker killed with SIGKILL runs no disconnect: its sockets stop counting once their presence
  records expire (the heartbeat is shortened to 1 s here), while the other worker's node stays online.

Needs Redis (REDIS_URL, else 127.0.0.1:6379; skipped without one), as every deployment with more
than one process does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from factories import DEFAULT_PASSWORD, make_node_with_token, make_user
from prometheus_client.parser import text_string_to_metric_families
from support.pool import EASY, make_group, share_frame
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from nodes.models import NodeStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_SECONDS = 1  # records of a killed worker expire 3 s after its last heartbeat
TIMEOUT = 30.0
HELLO = {"type": "hello", "v": 1, "client": "scale-out-test", "model": "m", "hardware": "h"}


# ---------------------------------------------------------------------------- two workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _database_url() -> str:
    """This run's test database, which the workers serve (the test is transactional: rows it writes
    are committed, and the workers' rows are visible to it)."""
    db = settings.DATABASES["default"]
    auth = urllib.parse.quote(db["USER"]) + (f":{urllib.parse.quote(db['PASSWORD'])}" if db.get("PASSWORD") else "")
    return f"postgresql://{auth}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def wait_for(condition: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


class Worker:
    """One site process: `python -m daphne -b 127.0.0.1 -p PORT config.asgi:application`."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws/node/"
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
                cwd=REPO,
                env=env | {"SAPO_SERVER_NAME": name},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log_tail()}"
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=5) as response:
                    return response.status == 200
            except OSError:
                return False

        assert wait_for(ready, timeout=90), f"{self.name} not ready:\n{self.log_tail()}"

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    # HTTP ------------------------------------------------------------------------------------

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=TIMEOUT) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """{(sample name, sorted labels): value} of /metrics."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=TIMEOUT) as response:
            text = response.read().decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


@pytest.fixture
def workers(transactional_db, tmp_path) -> Iterator[tuple[Worker, Worker]]:
    """Two workers on this run's database and Redis prefix, /metrics in multiprocess mode over one
    directory (docs/deploy.md), presence heartbeats every second. Stopped before the database is
    flushed (this fixture depends on transactional_db)."""
    import redis

    redis_url = settings.REDIS_URL or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {redis_url}: several site processes need one (CI has it)")
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "platform"), str(REPO / "node_client"), os.environ.get("PYTHONPATH", "")]
        ),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": redis_url,
        "SAPO_REDIS_PREFIX": settings.SAPO_REDIS_PREFIX,  # this run's: the test reads presence there too
        "SAPO_SECRET_KEY": "scale-out-test-key-shared-by-both-workers-0123456789",
        "SAPO_PRESENCE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "SAPO_LOG_LEVEL": "WARNING",
    }
    with ExitStack() as stack:
        pair = []
        for name in ("worker-1", "worker-2"):
            worker = Worker(name, env, tmp_path / f"{name}.log")
            stack.callback(worker.stop)
            pair.append(worker)
        for worker in pair:
            worker.wait_ready()
        yield pair[0], pair[1]


# ---------------------------------------------------------------------------- nodes and people


class NodeSocket:
    """A node's WebSocket to one worker, welcomed (so it has joined its node's and contributor's
    channel groups). Opened through the `node_socket` fixture, which closes it at teardown."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        assert self.ask(HELLO)["type"] == "welcome"

    def ask(self, frame: dict[str, Any]) -> dict[str, Any]:
        self.ws.send(json.dumps(frame))
        return json.loads(self.ws.recv(timeout=TIMEOUT))

    def share(self, *indexes: int, seed: int) -> list[str]:
        """Share honest groups (basic_arithmetic #index of `seed`); the ids the worker accepted."""
        # The integration servers' default swarm serves the easy catalogue (tests/integration/conftest.py).
        groups = [make_group(seed=seed, index=i, right=2, wrong=2, catalogue=EASY) for i in indexes]
        ack = self.ask(share_frame(*groups))
        assert ack["type"] == "ack" and ack["rejected"] == [], ack
        return ack["accepted"]

    def close_code(self) -> int:
        """The code the server closed this socket with (waits for it)."""
        try:
            frame = self.ws.recv(timeout=TIMEOUT)
        except ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else -1
        raise AssertionError(f"got a frame instead of a close: {frame[:200]!r}")


@pytest.fixture
def node_socket() -> Iterator[Callable[[Worker, str], NodeSocket]]:
    """`node_socket(worker, token)`: a welcomed NodeSocket; every one is closed at teardown."""
    with ExitStack() as stack:

        def open_socket(worker: Worker, token: str) -> NodeSocket:
            headers = {"Authorization": f"Bearer {token}"}
            return NodeSocket(
                stack.enter_context(connect(worker.ws_url, additional_headers=headers, open_timeout=TIMEOUT))
            )

        yield open_socket


class Browser:
    """A person on the site: a cookie jar, logged in through the log-in form of one worker."""

    def __init__(self) -> None:
        self.cookies = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def csrf(self) -> str:
        return next(c.value for c in self.cookies if c.name == "csrftoken")

    def get(self, url: str) -> str:
        with self.opener.open(url, timeout=TIMEOUT) as response:
            return response.read().decode()

    def post(self, url: str, data: dict[str, str]) -> int:
        body = urllib.parse.urlencode({**data, "csrfmiddlewaretoken": self.csrf()}).encode()
        with self.opener.open(urllib.request.Request(url, data=body), timeout=TIMEOUT) as response:
            return response.status

    def log_in(self, worker: Worker, username: str) -> None:
        self.get(worker.url + "/accounts/login/")
        self.post(worker.url + "/accounts/login/", {"username": username, "password": DEFAULT_PASSWORD})
        assert any(c.name == "sessionid" for c in self.cookies), "the log-in failed"


def statuses_seen_by(worker: Worker, browser: Browser) -> dict[str, str]:
    """{node name: status} of the logged-in contributor's nodes, as one worker answers them."""
    return {node["name"]: node["status"] for node in json.loads(browser.get(worker.url + "/api/v1/nodes/"))}


# ---------------------------------------------------------------------------- tests


def test_counts_agree_and_a_ban_on_the_site_closes_sockets_on_both_workers(workers, node_socket):
    one, two = workers
    owner = make_user(username="spread", display_name="Spread")
    node_a, token_a = make_node_with_token(owner=owner, name="node-a")
    node_b, token_b = make_node_with_token(owner=owner, name="node-b")
    make_user(username="moderator", is_staff=True)

    # node-a shares through worker 1, node-b through worker 2; then node-a reconnects and lands on
    # worker 2 (a proxy without sticky sessions), holding a socket on each worker.
    a_on_one, b_on_two = node_socket(one, token_a), node_socket(two, token_b)
    assert len(a_on_one.share(1, 2, seed=11)) == 2
    assert len(b_on_two.share(3, 4, seed=12)) == 2
    a_on_two = node_socket(two, token_a)
    assert len(a_on_two.share(5, seed=11)) == 1

    expected_nodes = {"node-a": 3, "node-b": 2}
    for worker in workers:
        stats = worker.get_json("/api/v1/pool/stats/")
        assert (stats["groups"], stats["accepted"], stats["rejected"]) == (5, 5, 0), worker.name
        board = worker.get_json("/api/v1/leaderboard/?view=nodes")
        assert {row["name"]: row["accepted"] for row in board["nodes"]} == expected_nodes, worker.name
        contributors = worker.get_json("/api/v1/leaderboard/")["contributors"]
        assert [(row["contributor"], row["accepted"]) for row in contributors] == [("Spread", 5)], worker.name
        figures = worker.metrics()
        assert figures[("sapo_pool_groups", (("verdict", "accepted"),))] == 5  # read from PostgreSQL
        # Counted in the process that answered, summed over both (PROMETHEUS_MULTIPROC_DIR).
        assert figures[("sapo_group_verdicts_total", (("reason", ""), ("verdict", "accepted")))] == 5
        assert figures[("sapo_share_messages_total", ())] == 3
        assert figures[("sapo_node_sockets_open", ())] == 3

    # A moderator logged in on worker 2 bans node-a with the form of worker 1: both of node-a's
    # sockets close with 4403, whichever worker holds them; node-b's socket stays open and served.
    moderator = Browser()
    moderator.log_in(two, "moderator")
    assert (
        moderator.post(
            one.url + f"/moderation/nodes/{node_a.id}/action/", {"action": "ban", "reason": "forged rewards"}
        )
        == 200
    )
    assert a_on_one.close_code() == a_on_two.close_code() == 4403
    assert b_on_two.ask({"type": "sample", "v": 1, "n": 4})["type"] == "samples"
    with pytest.raises(ConnectionClosed) as refused:  # and a reconnect is refused on either worker
        node_socket(one, token_a)
    assert refused.value.rcvd.code == 4403

    # The contributor ban, made on worker 1, closes node-b's socket on worker 2.
    assert (
        moderator.post(
            one.url + f"/moderation/nodes/{node_b.id}/action/", {"action": "ban_contributor", "reason": "spam ring"}
        )
        == 200
    )
    assert b_on_two.close_code() == 4403
    for worker in workers:
        assert wait_for(lambda w=worker: w.metrics()[("sapo_node_sockets_open", ())] == 0), worker.name


def test_a_killed_workers_nodes_go_offline_and_the_other_workers_stay_online(workers, node_socket):
    one, two = workers
    owner = make_user(username="owner")
    _, token_1 = make_node_with_token(owner=owner, name="on-worker-1")
    _, token_2 = make_node_with_token(owner=owner, name="on-worker-2")
    sockets = [node_socket(one, token_1), node_socket(two, token_2)]
    browser = Browser()
    browser.log_in(one, "owner")
    both_online = {"on-worker-1": NodeStatus.ONLINE, "on-worker-2": NodeStatus.ONLINE}
    assert statuses_seen_by(one, browser) == statuses_seen_by(two, browser) == both_online
    time.sleep(2 * HEARTBEAT_SECONDS)  # a few heartbeats: renewing keeps both online
    assert statuses_seen_by(one, browser) == both_online

    two.stop(signal.SIGKILL)  # no goodbye, no disconnect(): its records stay until they expire
    offline_2 = {"on-worker-1": NodeStatus.ONLINE, "on-worker-2": NodeStatus.OFFLINE}
    assert wait_for(lambda: statuses_seen_by(one, browser) == offline_2), statuses_seen_by(one, browser)
    # Not a moment's reading: the survivor's heartbeats keep its node online.
    time.sleep(4 * HEARTBEAT_SECONDS)
    assert statuses_seen_by(one, browser) == offline_2
    assert sockets[0].ask({"type": "sample", "v": 1, "n": 4})["type"] == "samples"
    # /metrics in multiprocess mode no longer counts the dead worker's open socket.
    assert one.metrics()[("sapo_node_sockets_open", ())] == 1
