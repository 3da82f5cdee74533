"""The node client's WebSocketTransport against the real platform (daphne, PostgreSQL, the channel
layer) with several swarms: its hello names a swarm; a retired swarm is refused in one line naming
the open ones; pausing the swarm stops its sharing and reporting until it opens again, the groups waiting in
the outbox and the reports in memory."""

from __future__ import annotations

import time

import pytest
from factories import make_node_with_token, make_swarm, make_user
from support.live_nodes import wait_for

from pool.models import NodeRound, Rollout
from sapo_node import protocol
from sapo_node.groups import Group
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry
from sapo_node.transport import Hello
from swarms.services import swarm_state_set

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def honest_group(i: int) -> Group:
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    entry = build_entry(spec, 7, i)
    completions = [f"<answer>{entry['answer']}</answer>", "<answer>nope</answer>"]
    return Group(
        f"00000000-0000-4000-8000-{i:012d}",
        1,
        TaskRef("basic_arithmetic", 7, i),
        entry["question"],
        entry["answer"],
        completions,
        [1.0, 0.0],
    )


def hello(swarm: str | None) -> Hello:
    return Hello("sapo-node/test", "tiny", "cpu", 2, 2, swarm=swarm)


def test_a_retired_swarm_is_refused_in_one_line_naming_the_open_swarms(swarm_server, transports, tmp_path, caplog):
    staff = make_user(is_staff=True)
    old = make_swarm(slug="old-campaign", actor=staff)
    make_swarm(slug="new-campaign", actor=staff)
    swarm_state_set(actor=staff, swarm=old, state="retired", reason="over")
    _, token = make_node_with_token()
    t = transports(swarm_server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    t.start(hello("old-campaign"))
    assert wait_for(lambda: t.status == f"refused ({protocol.CLOSE_SWARM_RETIRED})")
    line = next(r.getMessage() for r in caplog.records if "not retrying" in r.getMessage())
    assert "this swarm is retired (4410)" in line and "open swarms:" in line and "new-campaign" in line


def test_pausing_the_swarm_stops_sharing_until_it_opens_again(swarm_server, transports, tmp_path):
    staff = make_user(is_staff=True)
    swarm = make_swarm(slug="pausable", actor=staff)
    node, token = make_node_with_token()
    t = transports(swarm_server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    t.start(hello("pausable"))
    assert t.wait_connected(20) and t.swarm["slug"] == "pausable"
    swarm_state_set(actor=staff, swarm=swarm, state="paused", reason="maintenance")
    assert wait_for(lambda: t.status == "paused")
    t.share([honest_group(1)])
    t.report({"round": 1, "reward_mean": 0.5, "used": []})
    time.sleep(1.0)  # many poll intervals: a node that shared would have
    assert t.counts().pending == 1 and not Rollout.objects.filter(node=node).exists()
    assert not NodeRound.objects.filter(node=node).exists()
    swarm_state_set(actor=staff, swarm=swarm, state="open", reason="done")
    assert wait_for(lambda: t.status == "connected")
    assert t.flush(20) and t.counts().accepted == 1
    assert Rollout.objects.get(node=node).swarm_id == swarm.id
    # The report made while paused waited, and went once the swarm opened.
    assert wait_for(lambda: NodeRound.objects.filter(node=node, round=1).exists())
