"""Socket orders that no process and no Redis can lose (nodes.events, sockets.closes): two site processes on
one database and one Redis of their own (tests/support/redis_server.py), and the changes made by a third
process that exits at once, as an operator's `manage.py shell` or a web worker that restarts would.

- a revocation or a ban made while Redis is down closes the sockets on both site processes within
  seconds, though the process that made it is gone;
- a revocation made in the first moment after Redis came back empty (no process has joined the closes
  group again yet) closes the socket all the same;
- a swarm paused while Redis is down: the staff page answers as for any change, and the swarm's nodes
  are told and stop sharing within seconds; reopened, they share again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import make_node, make_node_token, make_node_with_token, make_user
from support.live_nodes import TIMEOUT, close_code, open_node
from support.pool import EASY, make_group, share_frame
from support.redis_server import RedisServer, redis_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
#: How often the site processes read the orders here (settings.SAPO_SOCKET_ORDERS_SECONDS).
ORDERS_SECONDS = 1.0
#: What an order may take to reach a socket by the database's path: a read, and a slow machine's slack.
WITHIN = ORDERS_SECONDS + 4.0


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture
def sites(asgi_server, redis: RedisServer, settings, tmp_path: Path):
    """Two site processes on `redis` and this run's test database."""
    from channels.layers import channel_layers

    from common import redis_client

    prefix = f"orders{redis.port}"
    on_redis = redis.server_settings(prefix)
    extra = {**on_redis, "SAPO_SOCKET_ORDERS_SECONDS": ORDERS_SECONDS}
    with (
        asgi_server(settings=extra, log_path=tmp_path / "a.log") as a,
        asgi_server(settings=extra, log_path=tmp_path / "b.log") as b,
    ):
        for name, value in on_redis.items():  # after asgi_server, which sets this process's prefix
            setattr(settings, name, value)
        channel_layers.backends.clear()
        try:
            yield a, b, prefix
        finally:
            channel_layers.backends.clear()
            redis_client._clients.clear()


def in_another_process(code: str, redis: RedisServer, prefix: str) -> None:
    """Run `code` in `manage.py shell`, a process of its own on this test's database and Redis, which
    exits when it is done."""
    from django.db import connection

    db = connection.settings_dict
    url = f"postgresql://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "REDIS_URL": redis.url, "SAPO_REDIS_PREFIX": prefix}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_revocation_made_while_redis_is_down_by_a_process_that_exits_closes_the_socket(sites, redis) -> None:
    a, b, prefix = sites
    node, token = make_node_with_token()
    with open_node(b, token) as ws:
        redis.stop()
        in_another_process(
            f"from nodes.models import Node; from nodes.services import node_token_revoke; "
            f"assert node_token_revoke(node=Node.objects.get(id={node.id})) == 1",
            redis,
            prefix,
        )
        started = time.monotonic()
        assert close_code(ws, WITHIN) == 4401  # Redis still down: the database carried it
        assert time.monotonic() - started < WITHIN
    redis.start()


def test_a_ban_made_while_redis_is_down_closes_the_contributor_s_sockets_on_every_process(sites, redis) -> None:
    a, b, prefix = sites
    owner = make_user(username="carol")
    _, token_a = make_node_token(node=make_node(owner=owner, name="one"))
    _, token_b = make_node_token(node=make_node(owner=owner, name="two"))
    make_user(username="staff", is_staff=True)
    with open_node(a, token_a) as on_a, open_node(b, token_b) as on_b:
        redis.stop()
        in_another_process(
            f"from accounts.models import User; from moderation.services import contributor_ban; "
            f"contributor_ban(actor=User.objects.get(username='staff'), user=User.objects.get(id={owner.id}), "
            f"reason='spam')",
            redis,
            prefix,
        )
        assert close_code(on_a, WITHIN) == 4403
        assert close_code(on_b, WITHIN) == 4403
    redis.start()


def test_a_revocation_just_after_redis_came_back_empty_closes_the_socket(sites, redis) -> None:
    from nodes.services import node_token_revoke

    a, _, _ = sites
    node, token = make_node_with_token()
    with open_node(a, token) as ws:
        redis.flush()  # every process's membership of the closes group is gone until it joins again
        assert node_token_revoke(node=node) == 1  # its message reaches no member
        assert close_code(ws, WITHIN) == 4401


def test_a_swarm_paused_while_redis_is_down_stops_its_nodes_sharing_within_seconds(sites, redis, client) -> None:
    from swarms.models import Swarm

    a, b, _ = sites
    staff = make_user(username="operator", is_staff=True)
    swarm = Swarm.objects.get(is_default=True)
    _, token = make_node_with_token()
    with open_node(b, token, swarm=swarm.slug) as ws:
        redis.stop()
        client.force_login(staff)
        url = f"/swarms/{swarm.slug}/manage/"
        response = client.post(url, {"action": "state", "state": "paused", "reason": "maintenance"})
        assert response.status_code == 302, response.content[:500]  # done, and said so: no 500 after the commit
        told = json.loads(ws.recv(timeout=WITHIN))
        assert (told["type"], told["state"]) == ("swarm_state", "paused"), told
        ws.send(json.dumps(share_frame(make_group(index=1, catalogue=EASY), ref="paused")))
        reply = json.loads(ws.recv(timeout=TIMEOUT))
        assert (reply["type"], reply["code"], reply["ref"]) == ("error", "swarm_paused", "paused"), reply
        response = client.post(url, {"action": "state", "state": "open", "reason": "done"})
        assert response.status_code == 302
        told = json.loads(ws.recv(timeout=WITHIN))
        assert (told["type"], told["state"]) == ("swarm_state", "open"), told
        ws.send(json.dumps(share_frame(make_group(index=2, catalogue=EASY), ref="open")))
        reply = json.loads(ws.recv(timeout=TIMEOUT))
        assert reply["type"] == "ack" and reply["ref"] == "open", reply
    redis.start()
