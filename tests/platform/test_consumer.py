"""The node WebSocket end to end, through the ASGI application (WebsocketCommunicator, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async as sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone
from factories import make_swarm, make_user
from node_sockets import ask, close_code, open_socket
from support.pool import make_group, share_frame

from moderation.trust import trust_for_nodes
from nodes.events import CLOSE_BANNED, CLOSES_GROUP, close_event
from nodes.models import Node
from nodes.presence import connection_counts, socket_book
from nodes.services import node_token_revoke
from pool.models import Consumption, NodeRound, NodeStorageHour, NodeVerdictCounts, Rollout
from pool.seams import moderation
from sapo_node.tasks import CATALOGUES, EASY_CATALOGUE
from swarms.catalogue import entries_of_catalogue
from swarms.services import swarm_catalogue_set

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]


def second_node_with_token(name: str = "desktop"):
    from factories import make_node_with_token

    return make_node_with_token(name=name)


# Authentication -------------------------------------------------------------------------------


async def test_no_header_closes_4401():
    socket = await open_socket(None)
    assert await close_code(socket) == 4401


@pytest.mark.parametrize(("scheme", "token"), [("Bearer", "sapo_wrong"), ("Bearer", "x"), ("Basic", "good")])
async def test_a_wrong_token_closes_4401(node_token, scheme, token):
    socket = await open_socket(node_token if token == "good" else token, scheme=scheme)
    assert await close_code(socket) == 4401


async def test_a_revoked_token_closes_4401(node, node_token):
    await sync_to_async(node_token_revoke)(node=node)
    socket = await open_socket(node_token)
    assert await close_code(socket) == 4401


async def test_a_banned_node_closes_4403(node, node_token):
    await sync_to_async(Node.objects.filter(id=node.id).update)(banned_at=timezone.now())
    socket = await open_socket(node_token)
    assert await close_code(socket) == 4403


async def test_a_banned_contributor_closes_4403(user, node_token):
    user.banned_at = timezone.now()
    await sync_to_async(user.save)()
    socket = await open_socket(node_token)
    assert await close_code(socket) == 4403


async def test_revoking_the_token_closes_an_open_socket_4401(node, node_token):
    socket = await open_socket(node_token)
    await sync_to_async(node_token_revoke)(node=node)
    assert await close_code(socket) == 4401


async def test_presence_counts_open_sockets(node, node_token):
    first, second = await open_socket(node_token), await open_socket(node_token)
    await ask(first, {"type": "hello", "v": 1})
    await ask(second, {"type": "hello", "v": 1})
    assert await sync_to_async(connection_counts)([node.id]) == {node.id: 2}
    await first.disconnect()
    assert await sync_to_async(connection_counts)([node.id]) == {node.id: 1}
    await second.disconnect()
    assert await sync_to_async(connection_counts)([node.id]) == {}
    assert (await sync_to_async(Node.objects.get)(id=node.id)).last_seen_at is not None


# Messages ---------------------------------------------------------------------------------------


async def test_hello_gets_welcome_with_catalogue_and_limits(node, node_token):
    await sync_to_async(make_swarm)(slug="easy", catalogue="easy", recommended_models=["tiny-mini"])
    socket = await open_socket(node_token)
    hello = {"type": "hello", "v": 1, "ref": "h1", "client": "sapo-node/0.1", "model": "tiny", "swarm": "easy"}
    reply = await ask(socket, hello)
    assert reply["type"] == "welcome" and reply["ref"] == "h1"
    assert (reply["node_id"], reply["node_name"]) == (node.id, "laptop")
    assert reply["catalogue"]["name"] == "easy@1"
    assert [t["dataset"] for t in reply["catalogue"]["tasks"]] == EASY_CATALOGUE.datasets
    assert reply["swarm"] == {
        "slug": "easy",
        "state": "open",
        "catalogue_version": 1,
        "recommended_models": ["tiny-mini"],
        "local": 4,
        "external": 4,
    }
    assert reply["limits"]["max_groups_per_message"] == 64
    await socket_book().beat(renew=False)  # what the node said is written with the process's next beat
    assert (await sync_to_async(Node.objects.get)(id=node.id)).client_version == "sapo-node/0.1"
    await socket.disconnect()


async def test_what_nodes_say_in_hello_is_written_in_one_statement_per_beat(user, statements):
    """A crowd of nodes saying hello for the first time costs one statement at the next beat, not a
    database call each; a node saying the same again writes nothing."""
    from factories import make_node_with_token

    nodes = [await sync_to_async(make_node_with_token)(owner=user, name=f"n{i}") for i in range(5)]
    sockets = [await open_socket(token) for _, token in nodes]
    for i, socket in enumerate(sockets):
        hello = {"type": "hello", "v": 1, "client": f"sapo-node/{i}", "model": "tiny", "hardware": "cpu"}
        assert (await ask(socket, hello))["type"] == "welcome"
    statements.clear()
    await socket_book().beat(renew=False)
    assert len([s for s in statements if "client_version" in s]) == 1  # (and one for last seen)
    stored = await sync_to_async(lambda: dict(Node.objects.filter(owner=user).values_list("name", "client_version")))()
    assert stored == {f"n{i}": f"sapo-node/{i}" for i in range(5)}
    # The same hello again, on the same socket and on a new one: nothing to write.
    hello = {"type": "hello", "v": 1, "client": "sapo-node/0", "model": "tiny", "hardware": "cpu"}
    assert (await ask(sockets[0], hello))["type"] == "welcome"
    again = await open_socket(nodes[0][1])
    assert (await ask(again, hello))["type"] == "welcome"
    assert socket_book().hellos == {}
    for socket in [*sockets, again]:
        await socket.disconnect()


async def test_welcome_follows_the_catalogue_and_limits_in_force(node, node_token, settings):
    """The welcome's catalogue and limits are serialised once per process: a new catalogue version or
    a change of limits shows in the next socket's welcome."""
    swarm = await sync_to_async(make_swarm)(slug="easy", catalogue="easy")
    staff = await sync_to_async(make_user)(is_staff=True)
    replies = []
    for catalogue, groups in ((None, 64), ("sapo", 64), (None, 5), ("easy", 5)):
        if catalogue is not None:  # a new version
            entries = entries_of_catalogue(CATALOGUES[catalogue])
            await sync_to_async(swarm_catalogue_set)(actor=staff, swarm=swarm, entries=entries)
        settings.SAPO_LIMITS = {"max_groups_per_message": groups}
        socket = await open_socket(node_token)
        replies.append(await ask(socket, {"type": "hello", "v": 1, "swarm": "easy"}))
        await socket.disconnect()
    assert [(r["catalogue"]["name"], r["limits"]["max_groups_per_message"]) for r in replies] == [
        ("easy@1", 64),
        ("easy@2", 64),
        ("easy@2", 5),
        ("easy@3", 5),
    ]


async def test_share_accepts_an_honest_group_and_stores_verified_rewards(node, node_token):
    socket = await open_socket(node_token)
    group = make_group(right=2, wrong=2)
    reply = await ask(socket, share_frame(group, ref="s1"))
    challenge = reply.pop("challenge")  # the questions the node is to answer next (pool.challenges)
    assert challenge.startswith(f"c1.{node.id}.")
    assert reply == {"type": "ack", "for": "share", "accepted": [group["id"]], "rejected": [], "v": 1, "ref": "s1"}
    row = await sync_to_async(Rollout.objects.get)(id=group["id"])
    assert row.node_id == node.id and row.verdict == "accepted" and row.sampleable
    assert row.verified_rewards == [1.0, 1.0, 0.0, 0.0] == row.claimed_rewards
    counts = await sync_to_async(NodeVerdictCounts.objects.get)(node=node)
    assert (counts.accepted_groups, counts.rejected_groups) == (1, 0)
    await socket.disconnect()


def _forge_reward(g):
    g["rewards"] = [1.0] * len(g["rewards"])


def _forge_answer(g):
    g["answer"] = "999999"


def _forge_question(g):
    g["question"] = "What is 1 + 1?"


def _forge_dataset(g):
    g["task"]["dataset"] = "made_up_dataset"


async def test_forged_groups_are_rejected_stored_and_counted(node, node_token):
    socket = await open_socket(node_token)
    groups = {}
    for reason, forge in [
        ("reward_mismatch", _forge_reward),
        ("answer_mismatch", _forge_answer),
        ("question_mismatch", _forge_question),
        ("unknown_task", _forge_dataset),
    ]:
        group = make_group(right=1, wrong=1)
        forge(group)
        groups[reason] = group
    reply = await ask(socket, share_frame(*groups.values()))
    assert reply["accepted"] == []
    assert reply["rejected"] == [{"id": g["id"], "reason": reason} for reason, g in groups.items()]
    rows = {str(r.id): r for r in await sync_to_async(list)(Rollout.objects.all())}
    for reason, group in groups.items():
        row = rows[group["id"]]
        assert (row.verdict, row.reason, row.sampleable) == ("rejected", reason, False)
        expected = [1.0, 0.0] if reason == "reward_mismatch" else None  # forged question or answer: not scored
        assert row.verified_rewards == expected
        assert row.claimed_rewards == group["rewards"]
    counts = await sync_to_async(NodeVerdictCounts.objects.get)(node=node)
    assert (counts.accepted_groups, counts.rejected_groups) == (0, 4)
    # The node's one trust is moderation's: four rejections leave its streak at 0, a new node's trust.
    assert await sync_to_async(trust_for_nodes)([node.id]) == pytest.approx({node.id: 0.1})
    await socket.disconnect()


async def test_a_replayed_id_gets_the_same_verdict_and_one_row(node, node_token):
    socket = await open_socket(node_token)
    good, forged = make_group(), make_group(index=8)
    _forge_reward(forged)
    first = await ask(socket, share_frame(good, forged))
    again = await ask(socket, share_frame(good, forged))
    assert first == again
    assert await sync_to_async(Rollout.objects.count)() == 2
    counts = await sync_to_async(NodeVerdictCounts.objects.get)(node=node)
    assert (counts.accepted_groups, counts.rejected_groups) == (1, 1)
    await socket.disconnect()


async def test_shares_of_nodes_waiting_at_once_are_stored_together_each_answered_its_own(settings):
    from factories import make_node_with_token
    from prometheus_client import REGISTRY

    settings.SAPO_SHARE_SLOTS = 1  # one batch at a time: the shares sent meanwhile wait, and go together
    settings.SAPO_SHARE_BATCH = 4
    nodes = [await sync_to_async(make_node_with_token)(name=f"n{i}") for i in range(6)]
    sockets = [await open_socket(token) for _, token in nodes]
    groups = [make_group(index=20 + i) for i in range(6)]
    forged = make_group(index=40)
    _forge_reward(forged)

    def together() -> tuple[float, float]:
        return (
            REGISTRY.get_sample_value("sapo_shares_stored_together_count") or 0.0,
            REGISTRY.get_sample_value("sapo_shares_stored_together_sum") or 0.0,
        )

    before = together()
    frames = [
        share_frame(g, forged, ref=f"s{i}") if i == 3 else share_frame(g, ref=f"s{i}") for i, g in enumerate(groups)
    ]
    # forged carries one id: only node 3 sends it
    replies = await asyncio.gather(*(ask(socket, frame) for socket, frame in zip(sockets, frames, strict=True)))
    batches, shares = (a - b for a, b in zip(together(), before, strict=True))
    assert shares == 6 and batches < 6  # some were stored together
    for i, (reply, g) in enumerate(zip(replies, groups, strict=True)):
        assert reply["ref"] == f"s{i}" and reply["accepted"] == [g["id"]]
        assert reply["rejected"] == ([{"id": forged["id"], "reason": "reward_mismatch"}] if i == 3 else [])
    rows = dict(await sync_to_async(list)(Rollout.objects.values_list("id", "node_id")))
    assert {str(k): v for k, v in rows.items()} == {
        **{g["id"]: node.id for g, (node, _) in zip(groups, nodes, strict=True)},
        forged["id"]: nodes[3][0].id,
    }
    counts = dict(
        (n, (a, r))
        for n, a, r in await sync_to_async(list)(
            NodeVerdictCounts.objects.values_list("node_id", "accepted_groups", "rejected_groups")
        )
    )
    assert counts == {node.id: (1, 1 if i == 3 else 0) for i, (node, _) in enumerate(nodes)}
    for socket in sockets:
        await socket.disconnect()


async def test_another_nodes_id_is_an_id_conflict_and_stores_nothing(node, node_token):
    group = make_group()
    socket = await open_socket(node_token)
    await ask(socket, share_frame(group))
    other, other_token = await sync_to_async(second_node_with_token)()
    intruder = await open_socket(other_token)
    copy, fresh = make_group(index=9, rollout_id=group["id"]), make_group(index=10)
    reply = await ask(intruder, share_frame(copy, fresh))
    assert reply["rejected"] == [{"id": group["id"], "reason": "id_conflict"}] and reply["accepted"] == [fresh["id"]]
    row = await sync_to_async(Rollout.objects.get)(id=group["id"])
    assert row.node_id == node.id and row.index == 7
    assert await sync_to_async(Rollout.objects.count)() == 2
    # the conflict counts as the intruder's rejection; only its new group is charged to its storage
    counts = await sync_to_async(NodeVerdictCounts.objects.get)(node=other)
    assert (counts.accepted_groups, counts.rejected_groups) == (1, 1)
    third, third_token = await sync_to_async(second_node_with_token)("third")
    witness = await open_socket(third_token)
    await ask(witness, share_frame(make_group(index=10)))  # the same group alone, under a new id

    def stored_bytes(n):
        return NodeStorageHour.objects.get(node=n).bytes

    assert await sync_to_async(stored_bytes)(other) == await sync_to_async(stored_bytes)(third) > 0
    await witness.disconnect()
    await socket.disconnect()
    await intruder.disconnect()


async def test_sample_returns_other_nodes_groups_with_their_name_never_the_askers(node, node_token):
    mine = make_group(index=1)
    socket = await open_socket(node_token)
    await ask(socket, share_frame(mine))
    other, other_token = await sync_to_async(second_node_with_token)("desktop")
    theirs = make_group(index=2)
    other_socket = await open_socket(other_token)
    await ask(other_socket, share_frame(theirs))
    reply = await ask(socket, {"type": "sample", "v": 1, "n": 5, "ref": "q"})
    assert reply["type"] == "samples" and reply["ref"] == "q"
    assert [r["id"] for r in reply["rollouts"]] == [theirs["id"]]
    sampled = reply["rollouts"][0]
    assert sampled["node"] == "desktop"
    assert sampled["rewards"] == theirs["rewards"] and sampled["task"] == theirs["task"]
    assert sampled["question"] == theirs["question"] and sampled["answer"] == theirs["answer"]
    await socket.disconnect()
    await other_socket.disconnect()


async def test_report_stores_the_round_and_credits_each_used_group_once(node, node_token):
    other, other_token = await sync_to_async(second_node_with_token)()
    other_socket = await open_socket(other_token)
    theirs, unsampled, rejected = make_group(index=2), make_group(index=3), make_group(index=5)
    _forge_reward(rejected)
    await ask(other_socket, share_frame(theirs, rejected))
    socket = await open_socket(node_token)
    mine = make_group(index=4)
    await ask(socket, share_frame(mine))
    assert [r["id"] for r in (await ask(socket, {"type": "sample", "v": 1, "n": 5}))["rollouts"]] == [theirs["id"]]
    await ask(other_socket, share_frame(unsampled))  # accepted after the sample: never served to the node
    used = [theirs["id"], unsampled["id"], rejected["id"], mine["id"], str(uuid.uuid4())]
    report = {"type": "report", "v": 1, "round": 3, "reward_mean": 0.4, "groups_local": 4, "used": used}
    assert await ask(socket, report) == {"type": "ack", "for": "report", "round": 3, "v": 1}
    assert await ask(socket, {**report, "round": 4}) == {"type": "ack", "for": "report", "round": 4, "v": 1}
    credits = await sync_to_async(list)(Consumption.objects.values_list("consumer_id", "rollout_id", "author_id"))
    assert credits == [(node.id, uuid.UUID(theirs["id"]), other.id)]
    node_round = await sync_to_async(NodeRound.objects.get)(node=node, round=3)
    assert node_round.figures == {"reward_mean": 0.4, "groups_local": 4}
    await socket.disconnect()
    await other_socket.disconnect()


async def test_a_contributors_nodes_cannot_credit_each_other_even_after_sampling(user, node, node_token):
    """Three nodes of one contributor listing each other's groups in `used`."""
    from factories import make_node_with_token

    sibling, sibling_token = await sync_to_async(make_node_with_token)(owner=user, name="desktop")
    stranger, stranger_token = await sync_to_async(second_node_with_token)("stranger")
    author, sibling_socket = await open_socket(node_token), await open_socket(sibling_token)
    stranger_socket = await open_socket(stranger_token)
    groups = [make_group(index=i) for i in (2, 3)]
    await ask(author, share_frame(*groups))
    used = [g["id"] for g in groups]
    report = {"type": "report", "v": 1, "round": 1, "used": used}
    # Without sampling: nothing. After sampling: the sibling still earns its contributor nothing.
    assert (await ask(sibling_socket, report))["type"] == "ack"
    assert len((await ask(sibling_socket, {"type": "sample", "v": 1, "n": 5}))["rollouts"]) == 2
    assert (await ask(sibling_socket, {**report, "round": 2}))["type"] == "ack"
    assert (await ask(stranger_socket, report))["type"] == "ack"
    assert await sync_to_async(Consumption.objects.count)() == 0
    # A stranger who was served the groups credits them.
    assert len((await ask(stranger_socket, {"type": "sample", "v": 1, "n": 5}))["rollouts"]) == 2
    assert (await ask(stranger_socket, {**report, "round": 2}))["type"] == "ack"
    credits = await sync_to_async(list)(Consumption.objects.values_list("consumer_id", "author_id"))
    assert sorted(credits) == [(stranger.id, node.id), (stranger.id, node.id)]
    for socket in (author, sibling_socket, stranger_socket):
        await socket.disconnect()


# Limits ---------------------------------------------------------------------------------------


async def test_every_limit_answers_its_code_stores_nothing_and_keeps_the_socket(node_token, settings):
    settings.SAPO_LIMITS = {
        "max_frame_bytes": 4000,
        "max_groups_per_message": 2,
        "max_completions_per_group": 3,
        "max_chars_per_completion": 300,
        "max_sample_n": 4,
        "max_used_per_report": 2,
    }
    socket = await open_socket(node_token)
    too_many_completions = make_group(right=2, wrong=2)
    long_completion = make_group(right=1, wrong=1)
    long_completion["completions"][1] = "x" * 301
    cases = [
        ("{not json", "invalid_json"),
        ({"type": "hello", "v": 7, "ref": "r"}, "unsupported_version"),
        ({"type": "dance", "v": 1}, "unknown_type"),
        ({"type": "share", "v": 1, "rollouts": [{"id": "x"}]}, "invalid_message"),
        ({"type": "hello", "v": 1, "client": "y" * 5000}, "frame_too_large"),
        (share_frame(make_group(), make_group(), make_group()), "too_many_groups"),
        (share_frame(too_many_completions), "too_many_completions"),
        (share_frame(long_completion), "completion_too_long"),
        ({"type": "sample", "v": 1, "n": 5}, "too_many_samples"),
        ({"type": "report", "v": 1, "round": 1, "used": [str(uuid.uuid4()) for _ in range(3)]}, "too_many_used"),
    ]
    for frame, code in cases:
        reply = await ask(socket, frame)
        assert (reply["type"], reply["code"]) == ("error", code), reply
        assert reply["detail"]
    assert (await ask(socket, {"type": "hello", "v": 7, "ref": "r"}))["ref"] == "r"
    assert await sync_to_async(Rollout.objects.count)() == 0
    assert await sync_to_async(NodeRound.objects.count)() == 0
    assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"
    await socket.disconnect()


async def test_consecutive_errors_close_4429_and_a_good_frame_resets_the_count(node_token, settings):
    settings.SAPO_LIMITS = {"max_consecutive_errors": 3}
    socket = await open_socket(node_token)
    for _ in range(2):
        assert (await ask(socket, "junk"))["code"] == "invalid_json"
    assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"
    for _ in range(3):
        assert (await ask(socket, "junk"))["code"] == "invalid_json"
    assert await close_code(socket) == 4429


async def test_rate_limit_holds_across_connections_of_a_node(node, node_token, settings):
    settings.SAPO_LIMITS = {"max_messages_per_minute": 20}
    # moderation may scale the limit by the node's trust
    quota = (await sync_to_async(moderation().node_message_quotas)(node_ids=[node.id], base=20))[node.id]
    first, second = await open_socket(node_token), await open_socket(node_token)
    for i in range(quota):
        socket = (first, second)[i % 2]
        assert (await ask(socket, {"type": "sample", "v": 1, "n": 1}))["type"] == "samples"
    reply = await ask(second, {"type": "share", "v": 1, "rollouts": [make_group()]})
    assert (reply["type"], reply["code"]) == ("error", "rate_limited")
    assert await sync_to_async(Rollout.objects.count)() == 0
    await first.disconnect()
    await second.disconnect()


# Bans through the channel layer ----------------------------------------------------------------


async def test_node_ban_closes_4403_through_the_in_memory_layer(node, node_token):
    socket = await open_socket(node_token)
    await ask(socket, {"type": "hello", "v": 1})  # the socket has joined its groups once it answers
    await get_channel_layer().group_send(CLOSES_GROUP, close_event(node_id=node.id, code=CLOSE_BANNED, reason="banned"))
    assert await close_code(socket) == 4403


async def test_a_ban_sent_while_the_socket_authenticates_still_closes_it(node, node_token):
    """The ban commits after the socket's one authenticating call read the tables (its session statement
    waits for the node's row, locked here) and its close arrives before the socket registers: the
    socket is closed all the same (sockets.closes remembers recent closes)."""
    import psycopg
    from django.db import connection

    db = connection.settings_dict
    params = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"], "host": db["HOST"]}
    with psycopg.connect(**params, port=db["PORT"] or None) as lock:
        lock.execute("SELECT id FROM nodes_node WHERE id = %s FOR UPDATE", [node.id])
        opening = asyncio.ensure_future(open_socket(node_token))
        await asyncio.sleep(0.5)  # accepted; its session statement waits for the row
        await get_channel_layer().group_send(
            CLOSES_GROUP, close_event(node_id=node.id, code=CLOSE_BANNED, reason="banned")
        )
        await asyncio.sleep(0.2)  # the close has arrived: no socket was registered for it yet
        lock.rollback()
    socket = await opening
    assert await close_code(socket) == 4403


@pytest.fixture
def redis_layer(settings, redis_url):
    url = redis_url
    settings.REDIS_URL = url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "common.channel_layers.BoundedRedisChannelLayer",  # as config/settings.py
            "CONFIG": {"hosts": [url], "prefix": f"sapo-test-{uuid.uuid4().hex[:8]}"},
        }
    }
    return url


async def test_node_ban_over_redis_closes_every_socket_of_the_contributor(redis_layer, user, node, node_token):
    from factories import make_node_with_token

    second_node, second_token = await sync_to_async(make_node_with_token)(owner=user, name="desktop")
    first, second = await open_socket(node_token), await open_socket(second_token)
    # The Redis rate counter is in use: both sockets answer (and have joined their groups).
    for socket in (first, second):
        assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"
    layer = get_channel_layer()
    assert type(layer).__name__ == "BoundedRedisChannelLayer"
    await layer.group_send(CLOSES_GROUP, close_event(contributor_id=user.id, code=CLOSE_BANNED, reason="banned"))
    assert await close_code(first) == 4403
    assert await close_code(second) == 4403


async def test_hundreds_of_sockets_joining_groups_at_once_wait_for_redis_connections_not_fail(redis_layer):
    """redis-py's default pool raised "Too many connections" past 100 commands in flight: 500 sockets
    opening at once in one process closed with 1011. The layer's pool makes them wait instead."""
    layer = get_channel_layer()
    channels = [await layer.new_channel() for _ in range(400)]
    await asyncio.gather(*(layer.group_add(f"g{i % 7}", c) for i, c in enumerate(channels)))
    await asyncio.gather(*(layer.group_discard(f"g{i % 7}", c) for i, c in enumerate(channels)))
    await layer.flush()


async def test_a_join_that_waits_for_a_free_connection_longer_than_the_bound_still_joins(
    redis_layer, settings, monkeypatch
):
    """The bound (SAPO_REDIS_TIMEOUT_SECONDS) is for Redis to answer, not for the queue for one of the
    pool's connections: a full pool in a burst of joins is not a Redis that stopped."""
    import common.redis_client

    settings.SAPO_REDIS_TIMEOUT_SECONDS = 0.2
    monkeypatch.setattr(common.redis_client, "REDIS_MAX_CONNECTIONS", 1)
    layer = get_channel_layer()
    pool = layer.connection(0).connection_pool
    assert pool.max_connections == 1
    held = await pool.get_connection()  # the pool's only connection, busy for five bounds
    channel = await layer.new_channel()
    join = asyncio.ensure_future(layer.group_add("patient", channel))
    await asyncio.sleep(1.0)
    assert not join.done()
    await pool.release(held)
    await asyncio.wait_for(join, 5)  # joined: no TimeoutError
    await layer.group_send("patient", {"type": "hi"})
    assert (await asyncio.wait_for(layer.receive(channel), 5))["type"] == "hi"
    await layer.flush()


async def test_a_socket_open_longer_than_the_group_expiry_still_receives_its_ban(settings, node, node_token):
    """Channel layers drop a group membership `group_expiry` after it was added (a day by default): the
    process joins the closes group again within half of it (sockets.closes), so a ban still closes a socket
    open for days."""
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "common.channel_layers.ThrottledInMemoryChannelLayer", "CONFIG": {"group_expiry": 2}}
    }
    channel_layers.backends.clear()
    try:
        socket = await open_socket(node_token)
        assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"
        await asyncio.sleep(4.5)  # more than twice the expiry: the first membership has expired
        await get_channel_layer().group_send(
            CLOSES_GROUP, close_event(node_id=node.id, code=CLOSE_BANNED, reason="banned")
        )
        assert await close_code(socket) == 4403
    finally:
        channel_layers.backends.clear()
