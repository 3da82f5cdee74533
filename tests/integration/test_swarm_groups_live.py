"""The outbox records each group's swarm, against the real platform (daphne, PostgreSQL, Redis): a
group goes only to the swarm it was made for. A swarm retired while a node holds groups for it (told
on the open socket, or at the next hello) drops them with one line; a node that comes back without
--swarm shares none of them into the default swarm. Groups of a swarm the node left wait for it."""

from __future__ import annotations

import time

import pytest
from factories import make_node_with_token, make_swarm, make_user
from support.live_nodes import wait_for

from pool.models import Rollout
from sapo_node import protocol
from sapo_node.groups import Group
from sapo_node.ids import uuid7
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry
from sapo_node.transport import Hello
from swarms.services import swarm_default_ensure, swarm_state_set

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]


def honest_groups(first: int, count: int) -> list[Group]:
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    groups = []
    for i in range(first, first + count):
        entry = build_entry(spec, 7, i)
        completions = [f"<answer>{entry['answer']}</answer>", "<answer>nope</answer>"]
        groups.append(
            Group(
                str(uuid7()),
                1,
                TaskRef("basic_arithmetic", 7, i),
                entry["question"],
                entry["answer"],
                completions,
                [1.0, 0.0],
            )
        )
    return groups


def hello(swarm: str | None) -> Hello:
    return Hello("sapo-node/test", "tiny", "cpu", 2, 2, swarm=swarm)


def queue_while_paused(staff, swarm, url, token, path, transports, groups) -> None:
    """A node in `swarm` shares `groups` while its operators pause it: they wait in the outbox."""
    t = transports(url, token, path)
    t.start(hello(swarm.slug))
    assert t.wait_connected(20) and t.swarm["slug"] == swarm.slug
    swarm_state_set(actor=staff, swarm=swarm, state="paused", reason="maintenance")
    assert wait_for(lambda: t.status == "paused")
    t.share(groups)
    assert t.counts().pending == len(groups)
    t.close()


def stored(node) -> dict[str, int]:
    return {str(i): s for i, s in Rollout.objects.filter(node=node).values_list("id", "swarm_id")}


def dropped_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]


def test_groups_pending_in_a_swarm_retired_under_the_node_are_dropped_never_shared_into_the_default(
    swarm_server, transports, tmp_path, caplog
):
    staff = make_user(is_staff=True)
    swarm = make_swarm(slug="winding-down", actor=staff)
    node, token = make_node_with_token()
    url, path = swarm_server.ws_url + "/ws/node/", tmp_path / "outbox.sqlite3"
    t = transports(url, token, path)
    t.start(hello("winding-down"))
    assert t.wait_connected(20)
    swarm_state_set(actor=staff, swarm=swarm, state="paused", reason="maintenance")
    assert wait_for(lambda: t.status == "paused")
    t.share(honest_groups(1, 6))
    assert t.counts().pending == 6

    swarm_state_set(actor=staff, swarm=swarm, state="retired", reason="over")
    assert wait_for(lambda: t.status == f"refused ({protocol.CLOSE_SWARM_RETIRED})")
    assert (t.counts().pending, t.counts().rejected, t.counts().refused) == (0, 0, 6)
    assert {reason for _, reason in t.outbox.refusals()} == {protocol.SWARM_RETIRED}
    [line] = dropped_lines(caplog)
    assert "6 " in line and "'winding-down'" in line and "retired" in line
    t.share(honest_groups(7, 2))  # made after the retirement, for the same swarm: dropped too
    assert wait_for(lambda: t.counts().refused == 8) and t.counts().pending == 0
    t.close()

    again = transports(url, token, path)  # the node restarted without --swarm: the default swarm
    again.start(hello(None))
    assert again.wait_connected(20) and again.swarm["slug"] == swarm_default_ensure().slug
    [fresh] = honest_groups(20, 1)
    again.share([fresh])
    assert again.flush(20)
    assert stored(node) == {fresh.id: swarm_default_ensure().id}  # none of the retired swarm's groups
    assert (again.counts().rejected, again.counts().refused) == (0, 8)


def test_a_hello_refused_as_retired_drops_the_groups_made_for_that_swarm(swarm_server, transports, tmp_path, caplog):
    staff = make_user(is_staff=True)
    swarm = make_swarm(slug="closed-while-away", actor=staff)
    node, token = make_node_with_token()
    url, path = swarm_server.ws_url + "/ws/node/", tmp_path / "outbox.sqlite3"
    queue_while_paused(staff, swarm, url, token, path, transports, honest_groups(1, 4))
    swarm_state_set(actor=staff, swarm=swarm, state="retired", reason="over")  # while the node is away

    back = transports(url, token, path)
    back.start(hello("closed-while-away"))
    assert wait_for(lambda: back.status == f"refused ({protocol.CLOSE_SWARM_RETIRED})")
    assert (back.counts().pending, back.counts().rejected, back.counts().refused) == (0, 0, 4)
    [line] = dropped_lines(caplog)
    assert "4 " in line and "'closed-while-away'" in line
    back.close()

    default = transports(url, token, path)
    default.start(hello(None))
    assert default.wait_connected(20)
    time.sleep(1.0)  # many poll intervals: a node that shared would have
    assert stored(node) == {}
    assert (default.counts().pending, default.counts().rejected, default.counts().refused) == (0, 0, 4)


def test_groups_of_a_swarm_the_node_left_wait_for_it_and_go_when_it_returns(swarm_server, transports, tmp_path, caplog):
    staff = make_user(is_staff=True)
    first = make_swarm(slug="first-home", actor=staff)
    second = make_swarm(slug="second-home", actor=staff)
    node, token = make_node_with_token()
    url, path = swarm_server.ws_url + "/ws/node/", tmp_path / "outbox.sqlite3"
    waiting = honest_groups(1, 3)
    queue_while_paused(staff, first, url, token, path, transports, waiting)

    moved = transports(url, token, path)  # its owner moved it to another swarm
    moved.start(hello("second-home"))
    assert moved.wait_connected(20)
    [here] = honest_groups(10, 1)
    moved.share([here])
    assert moved.flush(20)
    assert stored(node) == {here.id: second.id}
    assert moved.counts().pending == 3
    line = next(r.getMessage() for r in caplog.records if "wait for swarm" in r.getMessage())
    assert "3 " in line and "'first-home'" in line and "'second-home'" in line
    moved.close()

    swarm_state_set(actor=staff, swarm=first, state="open", reason="done")
    home = transports(url, token, path)  # and back
    home.start(hello("first-home"))
    assert home.wait_connected(20)
    assert home.flush(20) and home.counts().pending == 0
    assert stored(node) == {here.id: second.id} | {g.id: first.id for g in waiting}
