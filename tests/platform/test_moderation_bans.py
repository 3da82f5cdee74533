"""Bans through the real node socket: an open socket is closed with 4403 at once (channel layer), a
reconnect is refused, the groups leave the pool; a contributor ban closes every node of theirs."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async as db
from factories import make_node_with_token, make_user
from node_sockets import TIMEOUT, close_code, open_socket
from support.moderation import group, share, staff

from moderation.models import AuditEntry
from moderation.services import contributor_ban, node_ban
from pool.limits import current_limits
from pool.models import Rollout

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]


async def refused_code(token: str) -> int:
    return await close_code(await open_socket(token), settle=TIMEOUT)


async def test_banning_a_node_closes_its_open_socket_with_4403_and_refuses_reconnects():
    node, token = await db(make_node_with_token)(name="forger")
    rows = await db(share)(node, group(1), group(2))
    moderator = await db(staff)()
    socket = await open_socket(token, hello=True)

    await db(node_ban)(actor=moderator, node=node, reason="forged rewards")

    assert await close_code(socket, settle=TIMEOUT) == 4403
    assert await refused_code(token) == 4403
    statuses = await db(
        lambda: set(Rollout.objects.filter(id__in=[r.id for r in rows]).values_list("moderation_status", "sampleable"))
    )()
    assert statuses == {("quarantined", False)}
    entry = await db(AuditEntry.objects.get)(action="ban_node")
    assert (entry.target_id, entry.count, entry.reason) == (str(node.id), 2, "forged rewards")


async def test_banning_a_contributor_closes_all_their_nodes_sockets():
    owner = await db(make_user)(username="spammer")
    bystander = await db(make_user)(username="bystander")
    first, first_token = await db(make_node_with_token)(owner=owner, name="one")
    second, second_token = await db(make_node_with_token)(owner=owner, name="two")
    _, other_token = await db(make_node_with_token)(owner=bystander, name="three")
    await db(share)(first, group(3))
    await db(share)(second, group(4))
    moderator = await db(staff)()
    sockets = [await open_socket(first_token, hello=True), await open_socket(second_token, hello=True)]
    innocent = await open_socket(other_token, hello=True)

    await db(contributor_ban)(actor=moderator, user=owner, reason="spam ring")

    assert [await close_code(s, settle=TIMEOUT) for s in sockets] == [4403, 4403]
    assert await refused_code(second_token) == 4403
    # The bystander's socket is still open and served.
    await innocent.send_to(text_data=json.dumps({"type": "sample", "v": 1, "n": 4}))
    reply = await innocent.receive_json_from(timeout=TIMEOUT)
    assert reply["type"] == "samples" and reply["rollouts"] == []  # the banned contributor's groups are out
    await innocent.disconnect()
    count = await db(lambda: Rollout.objects.filter(node__owner=owner, moderation_status="quarantined").count())()
    assert count == 2


async def test_a_low_trust_node_gets_a_smaller_message_quota(settings):
    settings.SAPO_LIMITS = {"max_messages_per_minute": 10}
    node, token = await db(make_node_with_token)(name="newcomer")
    socket = await open_socket(token)
    hello = json.dumps({"type": "hello", "v": 1, "client": "t", "model": "m", "hardware": "h"})
    replies = []
    for _ in range(4):
        await socket.send_to(text_data=hello)
        replies.append(await socket.receive_json_from(timeout=TIMEOUT))
    # quota: int(10 * (0.25 + 0.75 * 0.1)) = 3 messages a minute, and welcome announces it (the client
    # paces itself to what it is told)
    assert [r["type"] for r in replies] == ["welcome", "welcome", "welcome", "error"]
    assert {r["limits"]["max_messages_per_minute"] for r in replies[:3]} == {3}
    assert replies[0]["limits"]["max_bytes_per_minute"] == current_limits().max_bytes_per_minute
    await socket.disconnect()
