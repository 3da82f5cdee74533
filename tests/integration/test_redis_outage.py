"""The site and its node sockets against a Redis of their own that is flushed, stopped and restarted
(docs/deploy.md, "When Redis fails"): a live daphne server (tests/conftest.py's asgi_server) on a
redis-server started for the test (tests/support/redis_server.py), never the shared one.

- /readyz answers 200 with node sockets open (its check does not queue behind the closes listener);
- a revocation closes an open socket after Redis lost its data (the worker joins the closes group again);
- a revocation made while Redis is down: tests/integration/test_socket_orders.py;
- frames during an outage are answered with their ref, the socket is never closed for the server's own
  failures, a node connecting meanwhile is welcomed, and the outage is one log line when it starts and
  one when it ends, no traceback;
- the public pages and the API answer 200 while Redis is down, presence shown as unknown;
- a Redis that hangs (SIGSTOP: connections are accepted, nothing answers) costs a share's ack, a socket's
  opening and a page at most SAPO_REDIS_TIMEOUT_SECONDS (+ slack for a loaded machine), is one log line,
  and the site recovers when it answers again;
- a server started while Redis is down logs one line for it, no traceback.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import make_node_with_token
from support.live_nodes import TIMEOUT, close_code, open_node
from support.pool import EASY, make_group, share_frame
from support.redis_server import RedisServer, redis_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

#: What a loaded test machine (2 cores shared with other test runs) may add to the documented bound.
SLACK = 2.0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def server(asgi_server, redis: RedisServer, settings, tmp_path: Path):
    """A site process on `redis`, and this test process (which revokes tokens: its closes go through the
    channel layer) on it too."""
    from channels.layers import channel_layers

    from common import redis_client

    log = tmp_path / "server.log"
    on_redis = redis.server_settings(f"outage{redis.port}")
    with asgi_server(settings={**on_redis, "SAPO_PRESENCE_HEARTBEAT_SECONDS": 2}, log_path=log) as live:
        for name, value in on_redis.items():  # after asgi_server, which sets this process's prefix
            setattr(settings, name, value)
        channel_layers.backends.clear()
        live.log = log
        try:
            yield live
        finally:
            channel_layers.backends.clear()
            redis_client._clients.clear()


@pytest.fixture
def on_redis(server, redis: RedisServer) -> RedisServer:
    return redis


def wait_for_log(server, text: str, timeout: float = 10.0) -> str:
    """The server's log once it holds `text`, or as it is after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while text not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    return server.log.read_text()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_readyz_is_200_with_node_sockets_open(server) -> None:
    _, token = make_node_with_token()
    with open_node(server, token):
        for _ in range(3):
            status, body = get(server.url + "/readyz")
            assert status == 200, body
            assert json.loads(body) == {"ready": True, "database": "ok", "channel_layer": "ok", "retention": "ok"}


def test_readyz_is_503_while_redis_is_down_and_200_when_it_returns(server, on_redis) -> None:
    _, token = make_node_with_token()
    with open_node(server, token):
        on_redis.stop()
        status, body = get(server.url + "/readyz")
        assert status == 503 and json.loads(body)["channel_layer"] != "ok"
        on_redis.start()
        status, body = get(server.url + "/readyz")
        assert status == 200, body


def test_a_revocation_closes_an_open_socket_after_redis_lost_its_data(server, on_redis) -> None:
    from nodes.services import node_token_revoke

    node, token = make_node_with_token()
    with open_node(server, token) as ws:
        on_redis.flush()  # what a restart without persistence or a failover to an empty replica leaves
        time.sleep(7)  # the worker joins the closes group again within 5 s (nodes.events.CLOSES_REJOIN_SECONDS)
        assert node_token_revoke(node=node) == 1
        assert close_code(ws, TIMEOUT) == 4401


def test_frames_during_an_outage_are_answered_with_their_ref_and_never_close_the_socket(server, on_redis) -> None:
    _, token = make_node_with_token()
    with open_node(server, token) as ws:
        on_redis.stop()
        # More frames than max_consecutive_errors (20): none of the server's failures counts against the node.
        for i in range(25):
            frame = (
                share_frame(make_group(index=100 + i, catalogue=EASY), ref=f"s{i}")
                if i % 2
                else {"type": "sample", "v": 1, "n": 2}
            )
            if not i % 2:
                frame["ref"] = f"q{i}"
            ws.send(json.dumps(frame))
            reply = json.loads(ws.recv(timeout=TIMEOUT))
            assert reply.get("ref") == frame["ref"], reply
            if frame["type"] == "share":
                assert reply["type"] == "ack" and len(reply["accepted"]) == 1, reply
        # A node (re)connecting meanwhile is welcomed: its presence record is written when Redis is back.
        _, other_token = make_node_with_token()
        with open_node(server, other_token):
            pass
        on_redis.start()
        ws.send(json.dumps(share_frame(make_group(index=200, catalogue=EASY), ref="after")))
        reply = json.loads(ws.recv(timeout=TIMEOUT))
        assert reply["type"] == "ack" and reply["ref"] == "after", reply
    log = wait_for_log(server, "Redis answers again")  # within a probe or a rejoin of the closes group
    assert "Traceback" not in log, log
    assert log.count("Redis is unavailable") == 1, log
    assert log.count("Redis answers again") == 1, log


def test_public_pages_and_the_api_answer_while_redis_is_down(server, on_redis) -> None:
    _, token = make_node_with_token()
    with open_node(server, token):
        on_redis.stop()
        for path in ("/", "/leaderboard/", "/swarm/", "/teams/", "/api/v1/swarm/", "/api/v1/teams/"):
            status, body = get(server.url + path)
            assert status == 200, (path, body[:500])
        status, body = get(server.url + "/api/v1/swarm/")
        assert json.loads(body)["nodes_online"] is None  # unknown, not 0
        status, body = get(server.url + "/swarm/")
        assert b"unknown" in body
        on_redis.start()


def test_a_hung_redis_costs_a_share_a_socket_and_a_page_at_most_the_timeout(server, on_redis, settings) -> None:
    bound = settings.SAPO_REDIS_TIMEOUT_SECONDS + SLACK
    _, token = make_node_with_token()
    with open_node(server, token) as ws:
        on_redis.pause()
        try:
            for i in range(6):
                frame = share_frame(make_group(index=300 + i, catalogue=EASY), ref=f"h{i}")
                started = time.monotonic()
                ws.send(json.dumps(frame))
                reply = json.loads(ws.recv(timeout=TIMEOUT))
                elapsed = time.monotonic() - started
                assert reply["type"] == "ack" and reply["ref"] == f"h{i}" and len(reply["accepted"]) == 1, reply
                assert elapsed <= bound, (i, elapsed)
            _, other_token = make_node_with_token()
            started = time.monotonic()
            with open_node(server, other_token):
                assert time.monotonic() - started <= bound
            started = time.monotonic()
            status, body = get(server.url + "/")
            assert status == 200, body[:500]
            assert time.monotonic() - started <= bound
        finally:
            on_redis.resume()
        ws.send(json.dumps(share_frame(make_group(index=400, catalogue=EASY), ref="after")))
        reply = json.loads(ws.recv(timeout=TIMEOUT))
        assert reply["type"] == "ack" and reply["ref"] == "after", reply
        assert get(server.url + "/readyz")[0] == 200
    log = wait_for_log(server, "Redis answers again")
    assert "Traceback" not in log, log
    assert log.count("Redis is unavailable") == 1, log
    assert log.count("Redis answers again") == 1, log


def test_a_server_started_while_redis_is_down_logs_one_line(asgi_server, redis: RedisServer, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    redis.stop()
    with asgi_server(settings=redis.server_settings(f"startdown{redis.port}"), log_path=log) as live:
        live.log = log
        for path in ("/", "/api/v1/swarm/"):
            status, body = get(live.url + path)
            assert status == 200, (path, body[:500])
        redis.start()
        deadline = time.monotonic() + 10
        while "Redis answers again" not in log.read_text() and time.monotonic() < deadline:
            assert get(live.url + "/")[0] == 200  # while down, a page a second tries Redis (common.outage)
            time.sleep(0.3)
        text = log.read_text()
    assert "Traceback" not in text, text
    assert text.count("Redis is unavailable") == 1, text
    assert text.count("Redis answers again") == 1, text
