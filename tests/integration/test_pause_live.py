"""Pause and resume from /me/ over a real socket: a tiny-mini node (the real WebSocketTransport and training
loop) against daphne, PostgreSQL and Redis; its owner presses Pause on /me/ (a POST with the site's
session, as the button's form sends it), the node finishes its step, says it is paused and stops
sharing and training with its socket open; Resume, and it shares and trains again. /me/ shows what the
node says it is doing all along (state, tokens/s, round time)."""

from __future__ import annotations

import copy
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from factories import make_node_with_token
from support.live_nodes import wait_for

from nodes.models import Node
from nodes.presence import connection_counts
from pool.models import Rollout
from sapo_node.config import NodeConfig
from sapo_node.loop import StopFlag, finish_node, play_round, start_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

#: A beat every 2 s (the node's status reaches the table within it) and the orders read every second.
QUICK = {"SAPO_PRESENCE_HEARTBEAT_SECONDS": 2, "SAPO_SOCKET_ORDERS_SECONDS": 1.0}


def stored(node: Node) -> int:
    return Rollout.objects.filter(node=node).count()


def said(node: Node) -> Node:
    return Node.objects.get(id=node.id)


def node_card(client: Any, node: Node) -> str:
    body = client.get("/me/").content.decode()
    match = re.search(rf'<article class="card node-card" id="node-{node.id}".*?</article>', body, re.S)
    assert match, body[:2000]
    return match.group(0)


def play_until(node: Any, stop: StopFlag) -> None:
    while not stop.requested and play_round(node, stop=stop) is not None:
        pass


def test_the_owner_pauses_the_node_from_me_and_resumes_it(
    swarm_servers, transports, tiny_mini_policy, tmp_path: Path, client, capsys
):
    node, token = make_node_with_token(name="pausable")
    client.force_login(node.owner)
    config = NodeConfig(
        out=str(tmp_path),
        model="tiny-mini",
        seed=3,
        rounds=0,
        questions=2,
        generations=4,
        max_new_tokens=16,
        local=2,
        external=2,
        checkpoint_every=0,
        connect_wait=10,
        flush_wait=20,
    )
    with swarm_servers(settings=QUICK) as server:
        t = transports(server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
        n = start_node(config, t, policy=(copy.deepcopy(tiny_mini_policy[0]), copy.deepcopy(tiny_mini_policy[1])))
        stop = StopFlag()
        rounds = threading.Thread(target=play_until, args=(n, stop), daemon=True)
        rounds.start()
        try:
            # Training: it shares, and says what it does (with its speed and round time).
            assert wait_for(lambda: stored(node) >= 4, timeout=60)
            assert wait_for(lambda: said(node).reported_state == "training" and said(node).tokens_per_second, 30)
            card = node_card(client, node)
            assert "<dd data-state>training</dd>" in card and "tokens/s" in card
            assert re.search(r'data-figure="round_seconds">[\d.]+ s<', card)
            assert ">Pause</button>" in card

            # Pause from /me/: the node finishes its step, says so, and waits with its socket open.
            assert client.post(f"/me/nodes/{node.id}/pause/").status_code == 302
            assert wait_for(lambda: said(node).reported_state == "paused" and said(node).reported_paused, 30)
            assert "paused from the site (resume on /me/)" in capsys.readouterr().out
            time.sleep(1)  # a share frame sent just before the pause has its answer
            rounds_then, stored_then = n.last_round, stored(node)
            time.sleep(4)  # a dozen of this node's rounds
            assert (n.last_round, stored(node)) == (rounds_then, stored_then)
            assert connection_counts([node.id]) == {node.id: 1}
            card = node_card(client, node)
            assert 'data-pause="paused"' in card and "Paused from the site" in card
            assert "<dd data-state>paused</dd>" in card and ">Resume</button>" in card

            # Resume: it trains and shares again.
            assert client.post(f"/me/nodes/{node.id}/resume/").status_code == 302
            assert wait_for(lambda: stored(node) > stored_then and n.last_round > rounds_then, timeout=60)
            assert wait_for(lambda: said(node).reported_state == "training" and not said(node).reported_paused, 30)
            assert "resumed" in capsys.readouterr().out
            assert 'data-pause="' not in node_card(client, node)
        finally:
            stop.requested = True
            rounds.join(60)
            finish_node(n)
