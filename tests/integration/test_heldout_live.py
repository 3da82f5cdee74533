"""Held-out checks end to end: tiny-mini nodes (the real training loop and WebSocketTransport) against
daphne, PostgreSQL and Redis. A sharing node and a silo node say `heldout` in their hello, answer the
server's checks between their rounds, and their scores are stored and shown on the swarm's page and on
each node's page; a node run with --no-heldout-check is never asked."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
from factories import make_node_with_token
from support.live_nodes import wait_for

from pool.models import HeldoutScore
from sapo_node.config import NodeConfig
from sapo_node.loop import StopFlag, finish_node, play_round, start_node
from swarms.services import swarm_default_ensure

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

#: A check after every round, four questions: two checks make an arm's figure (figures.heldout.MIN_ANSWERS).
CHECKS = {"SAPO_HELDOUT_EVERY_ROUNDS": 1, "SAPO_HELDOUT_MIN_SECONDS": 0.0, "SAPO_HELDOUT_QUESTIONS": 4}


def play_until(node, stop: StopFlag) -> None:
    while not stop.requested and play_round(node, stop=stop) is not None:
        pass


def checks(node) -> int:
    return HeldoutScore.objects.filter(node=node).count()


def test_sharing_and_silo_nodes_answer_checks_and_the_pages_show_them(
    swarm_servers, transports, tiny_mini_policy, tmp_path: Path, client
):
    nodes = {
        "sharing": (make_node_with_token(name="sharing"), {"external": 2}),
        "silo": (make_node_with_token(name="silo"), {"external": 0}),
        "opted-out": (make_node_with_token(name="opted-out"), {"external": 2, "no_heldout_check": True}),
    }
    with swarm_servers(settings=CHECKS) as server:
        running = []
        try:
            for name, ((_, token), options) in nodes.items():
                config = NodeConfig(
                    out=str(tmp_path / name),
                    model="tiny-mini",
                    seed=len(running) + 1,
                    questions=2,
                    generations=4,
                    max_new_tokens=16,
                    local=2,
                    checkpoint_every=0,
                    connect_wait=10,
                    flush_wait=10,
                    **options,
                )
                t = transports(server.ws_url + "/ws/node/", token, tmp_path / f"{name}.sqlite3")
                policy = (copy.deepcopy(tiny_mini_policy[0]), copy.deepcopy(tiny_mini_policy[1]))
                n, stop = start_node(config, t, policy=policy), StopFlag()
                thread = threading.Thread(target=play_until, args=(n, stop), daemon=True)
                thread.start()
                running.append((n, stop, thread))
            sharing, silo, opted_out = (node for (node, _), _ in nodes.values())
            assert wait_for(lambda: checks(sharing) >= 2 and checks(silo) >= 2, timeout=180)
        finally:
            for _, stop, _ in running:
                stop.requested = True
            for n, _, thread in running:
                thread.join(60)
                finish_node(n)
    assert checks(opted_out) == 0
    rows = HeldoutScore.objects.filter(node=sharing).order_by("answered_at")
    assert all(r.questions == 4 and 0 <= r.score <= 4 and r.round >= 1 for r in rows)

    swarm = swarm_default_ensure()
    page = client.get(f"/swarms/{swarm.slug}/").content.decode()
    assert 'id="heldout-panel"' in page and 'id="heldout-curve"' in page
    for arm in ("sharing", "silo"):
        stat = page.split(f'id="heldout-{arm}"', 1)[1].split("</div>", 1)[0]
        assert "95% interval" in stat and "1 node" in stat, stat
    node_page = client.get(f"/nodes/{sharing.id}/").content.decode()
    assert 'id="node-heldout-checks"' in node_page and node_page.count("<time datetime") >= 2
