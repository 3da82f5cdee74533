"""Several swarms on one site, over the node WebSocket (the project's ASGI application, real
PostgreSQL and channel layer): each node shares into and samples from its own swarm only, a group of
a dataset outside its swarm's catalogue is rejected, a node that names no swarm lands in the default
one, and pausing or retiring reaches connected nodes at once."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async as sync_to_async
from factories import make_node_with_token, make_swarm, make_user
from node_sockets import ask, close_code, open_socket
from support.pool import EASY, SAPO, make_group, share_frame

from nodes import presence
from pool.models import NodeRound, Rollout
from sapo_node import protocol
from swarms.models import Swarm
from swarms.scope import Scope
from swarms.services import swarm_default_ensure, swarm_state_set

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]

TIMEOUT = 5


async def joined(token: str, swarm: str | None) -> tuple[object, dict]:
    socket = await open_socket(token)
    hello = {"type": "hello", "v": 1, "client": "t", **({"swarm": swarm} if swarm else {})}
    welcome = await ask(socket, hello)
    assert welcome["type"] == "welcome", welcome
    return socket, welcome


async def test_nodes_of_two_swarms_share_and_sample_only_their_own_swarms_groups():
    easy = await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    paper = await sync_to_async(make_swarm)(slug="paper", catalogue="sapo")
    nodes = [await sync_to_async(make_node_with_token)() for _ in range(4)]
    sockets = {}
    for (node, token), swarm in zip(nodes, ["easy", "easy", "paper", "paper"], strict=True):
        sockets[node.id], welcome = await joined(token, swarm)
        assert welcome["swarm"]["slug"] == swarm
    shared = {}
    for i, ((node, _), catalogue, dataset) in enumerate(
        zip(nodes, [EASY, EASY, SAPO, SAPO], ["basic_arithmetic", "base_conversion", "arc_1d", "bf"], strict=True)
    ):
        group = make_group(dataset, catalogue=catalogue, index=10 + i)
        reply = await ask(sockets[node.id], share_frame(group))
        assert reply["accepted"] == [group["id"]], reply
        shared[node.id] = group["id"]
    stored = await sync_to_async(lambda: dict(Rollout.objects.values_list("id", "swarm_id")))()
    assert sorted(stored.values()) == sorted([easy.id, easy.id, paper.id, paper.id])
    # Each node draws the other node of its swarm's group, never the other swarm's.
    for (node, _), partner in zip(nodes, [nodes[1], nodes[0], nodes[3], nodes[2]], strict=True):
        reply = await ask(sockets[node.id], {"type": "sample", "v": 1, "n": 8})
        assert [g["id"] for g in reply["rollouts"]] == [shared[partner[0].id]]
    for socket in sockets.values():
        await socket.disconnect()


async def test_a_connected_nodes_presence_carries_the_swarm_its_hello_named():
    """What the swarm's nodes online read: each open socket's presence record is in the swarm its hello
    named (written with the process's next beat), and leaves it when the socket closes."""
    easy = await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    paper = await sync_to_async(make_swarm)(slug="paper", catalogue="sapo")
    easy_node, easy_token = await sync_to_async(make_node_with_token)(name="easy-node")
    paper_node, paper_token = await sync_to_async(make_node_with_token)(name="paper-node")
    easy_socket, _ = await joined(easy_token, "easy")
    paper_socket, _ = await joined(paper_token, "paper")
    await presence.socket_book().beat(renew=False)  # the beat that follows within SEEN_EVERY_SECONDS

    def online_in(swarm) -> set[int]:
        return presence.connected_node_ids([easy_node.id, paper_node.id], scope=Scope.swarm(swarm.id))

    assert await sync_to_async(online_in)(easy) == {easy_node.id}
    assert await sync_to_async(online_in)(paper) == {paper_node.id}
    await paper_socket.disconnect()
    assert await sync_to_async(online_in)(paper) == set()
    assert await sync_to_async(online_in)(easy) == {easy_node.id}
    await easy_socket.disconnect()


async def test_a_dataset_outside_the_nodes_swarm_is_rejected_with_unknown_task():
    await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    _, token = await sync_to_async(make_node_with_token)()
    socket, welcome = await joined(token, "easy")
    assert "arc_1d" not in [t["dataset"] for t in welcome["catalogue"]["tasks"]]
    group = make_group("arc_1d", catalogue=SAPO)  # honest, but of another swarm's catalogue
    reply = await ask(socket, share_frame(group))
    assert reply["accepted"] == [] and reply["rejected"] == [{"id": group["id"], "reason": "unknown_task"}]
    row = await sync_to_async(Rollout.objects.get)(id=group["id"])
    assert not row.sampleable and row.catalogue_version == 1
    await socket.disconnect()


async def test_a_node_that_names_no_swarm_lands_in_the_default_swarm():
    await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    default = await sync_to_async(swarm_default_ensure)()
    node, token = await sync_to_async(make_node_with_token)()
    socket, welcome = await joined(token, None)  # today's client: no "swarm" in its hello
    assert welcome["swarm"]["slug"] == default.slug
    group = make_group("basic_arithmetic", catalogue=SAPO)
    assert (await ask(socket, share_frame(group)))["accepted"] == [group["id"]]
    report = {"type": "report", "v": 1, "round": 1, "reward_mean": 0.5, "used": []}
    assert (await ask(socket, report))["type"] == "ack"
    assert (await sync_to_async(Rollout.objects.get)(id=group["id"])).swarm_id == default.id
    assert (await sync_to_async(NodeRound.objects.get)(node=node)).swarm_id == default.id
    await socket.disconnect()


async def test_a_hello_naming_an_unknown_swarm_is_refused_with_its_code_and_the_open_swarms():
    await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    _, token = await sync_to_async(make_node_with_token)()
    socket = await open_socket(token)
    reply = await ask(socket, {"type": "hello", "v": 1, "ref": "h", "swarm": "nope"})
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", protocol.UNKNOWN_SWARM, "h")
    assert "no swarm named 'nope'" in reply["detail"] and "easy" in reply["detail"]
    assert await close_code(socket) == protocol.CLOSE_UNKNOWN_SWARM


async def test_a_hello_naming_a_retired_swarm_is_refused_and_lists_the_open_ones():
    staff = await sync_to_async(make_user)(is_staff=True)
    old = await sync_to_async(make_swarm)(slug="old", catalogue="easy")
    await sync_to_async(make_swarm)(slug="new", catalogue="easy")
    await sync_to_async(swarm_state_set)(actor=staff, swarm=old, state="retired", reason="campaign over")
    _, token = await sync_to_async(make_node_with_token)()
    socket = await open_socket(token)
    reply = await ask(socket, {"type": "hello", "v": 1, "swarm": "old"})
    assert reply["code"] == protocol.SWARM_RETIRED
    assert reply["detail"].startswith("swarm 'old' is retired; open swarms:") and "new" in reply["detail"]
    assert await close_code(socket) == protocol.CLOSE_SWARM_RETIRED


async def test_pausing_tells_connected_nodes_which_then_share_nothing_until_it_opens_again():
    staff = await sync_to_async(make_user)(is_staff=True)
    swarm = await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    _, token = await sync_to_async(make_node_with_token)()
    socket, _ = await joined(token, "easy")
    await sync_to_async(swarm_state_set)(actor=staff, swarm=swarm, state="paused", reason="maintenance")
    told = await socket.receive_json_from(timeout=TIMEOUT)
    assert (told["type"], told["swarm"], told["state"]) == (protocol.SWARM_STATE, "easy", "paused")
    group = make_group("basic_arithmetic", catalogue=EASY)
    for _ in range(3):  # refusals of a paused swarm are not the node's errors: the socket stays open
        reply = await ask(socket, share_frame(group, ref="s"))
        assert (reply["type"], reply["code"], reply["ref"]) == ("error", protocol.SWARM_PAUSED, "s")
    assert (await ask(socket, {"type": "sample", "v": 1, "n": 2}))["code"] == protocol.SWARM_PAUSED
    report = {"type": "report", "v": 1, "ref": "r", "round": 1, "reward_mean": 0.5, "used": []}
    assert (await ask(socket, report))["code"] == protocol.SWARM_PAUSED
    assert not await sync_to_async(Rollout.objects.filter(id=group["id"]).exists)()
    assert not await sync_to_async(NodeRound.objects.exists)()
    await sync_to_async(swarm_state_set)(actor=staff, swarm=swarm, state="open", reason="done")
    assert (await socket.receive_json_from(timeout=TIMEOUT))["state"] == "open"
    assert (await ask(socket, share_frame(group)))["accepted"] == [group["id"]]
    await socket.disconnect()


async def test_retiring_tells_connected_nodes_the_open_swarms_and_closes_them_4410():
    staff = await sync_to_async(make_user)(is_staff=True)
    swarm = await sync_to_async(make_swarm)(slug="old", catalogue="easy")
    await sync_to_async(make_swarm)(slug="next", catalogue="easy")
    _, token = await sync_to_async(make_node_with_token)()
    _, other_token = await sync_to_async(make_node_with_token)()
    socket, _ = await joined(token, "old")
    bystander, _ = await joined(other_token, "next")
    await sync_to_async(swarm_state_set)(actor=staff, swarm=swarm, state="retired", reason="campaign over")
    told = await socket.receive_json_from(timeout=TIMEOUT)
    assert (told["type"], told["state"]) == (protocol.SWARM_STATE, "retired")
    assert "next" in told["detail"] and "next" in told["open"] and "old" not in told["open"]
    assert await close_code(socket) == protocol.CLOSE_SWARM_RETIRED
    assert await bystander.receive_nothing(timeout=0.3)  # another swarm's node hears nothing
    await bystander.disconnect()


async def test_any_places_the_node_in_the_open_swarm_with_the_fewest_active_nodes():
    busy = await sync_to_async(make_swarm)(slug="busy", catalogue="easy")
    await sync_to_async(make_swarm)(slug="quiet", catalogue="easy")
    staff = await sync_to_async(make_user)(is_staff=True)
    default = await sync_to_async(swarm_default_ensure)()
    await sync_to_async(swarm_state_set)(actor=staff, swarm=default, state="paused", reason="not this one")
    _, token = await sync_to_async(make_node_with_token)()
    socket, welcome = await joined(token, "busy")
    assert welcome["swarm"]["slug"] == busy.slug
    group = make_group("basic_arithmetic", catalogue=EASY)
    assert (await ask(socket, share_frame(group)))["accepted"] == [group["id"]]
    _, newcomer = await sync_to_async(make_node_with_token)()
    placed, welcome = await joined(newcomer, protocol.ANY_SWARM)
    assert welcome["swarm"]["slug"] == "quiet"
    for s in (socket, placed):
        await s.disconnect()


def test_any_is_chosen_once_per_few_seconds_per_process_and_a_change_of_a_swarm_chooses_again(
    django_assert_num_queries,
):
    from sockets.swarm_places import place_forget, place_of_hello, places_forget

    make_swarm(slug="busy", catalogue="easy")
    make_swarm(slug="quiet", catalogue="easy")
    places_forget()
    place, cost = place_of_hello(slug=protocol.ANY_SWARM)
    assert cost > 0
    with django_assert_num_queries(0):  # a crowd of `any` hellos costs one aggregate per process
        for _ in range(20):
            assert place_of_hello(slug=protocol.ANY_SWARM) == (place, 0.0)
    chosen = Swarm.objects.get(id=place.swarm_id)
    swarm_state_set(actor=make_user(is_staff=True), swarm=chosen, state="paused", reason="not this one")
    place_forget(chosen.id)  # what the change's socket order does in every process
    again, cost = place_of_hello(slug=protocol.ANY_SWARM)
    assert again.slug != place.slug and cost > 0


async def test_a_hello_that_reads_the_swarms_pays_for_it_from_the_nodes_cpu_budget(settings, monkeypatch):
    """`any`'s aggregate is PostgreSQL's work, not the socket thread's: its time is charged like a
    share's, so a node sending `any` hellos cannot make the server work for free."""
    from sockets import swarm_places

    settings.SAPO_LIMITS = {"max_cpu_ms_per_minute": 20}
    await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    choose = swarm_places.swarm_needing_nodes

    def choose_at_a_known_cost():
        # The aggregate over a big pool costs tens of milliseconds; here 50, however fast the machine.
        started = time.perf_counter()
        while time.perf_counter() - started < 0.05:
            pass
        return choose()

    monkeypatch.setattr(swarm_places, "swarm_needing_nodes", choose_at_a_known_cost)
    _, token = await sync_to_async(make_node_with_token)()
    socket, _ = await joined(token, protocol.ANY_SWARM)
    reply = await ask(socket, {"type": "sample", "v": 1, "ref": "next", "n": 1})
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", protocol.RATE_LIMITED, "next")
    assert "CPU" in reply["detail"]
    await socket.disconnect()
