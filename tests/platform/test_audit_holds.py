"""A node held after a failed audit (audits.models.NodeHold): the groups it shares meanwhile, with a
proof or without, are stored unaudited (`node_held`) and never served by the pool's sample; moderation
cannot put them back, and neither does the node's release (docs/audits.md, "Outcomes")."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async as sync_to_async
from factories import make_node, make_node_with_token
from node_sockets import ask, open_socket
from support.audits import make_audit, pending_group
from support.pool import SAPO, challenged_group, default_swarm, make_group, sampled, share_frame, to_rollout_in

from audits import selection
from audits.services import audit_fail, node_release
from pool import challenges
from pool.ingest import rollout_share
from pool.models import ModerationStatus, Rollout
from pool.services import rollout_set_moderation


def hold(node) -> None:
    """Fail an audit of one of the node's pending groups: the node is held."""
    audit = make_audit(node, [pending_group(node, index=10_000 + node.id)])
    assert audit_fail(audit_id=audit.id, reason="token 3 is not the seeded draw") is not None


def stored(group_id) -> tuple[str, str, bool]:
    row = Rollout.objects.get(id=group_id)
    return row.audit_state, row.audit_reason, row.sampleable


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_rate_counts")
async def test_a_held_nodes_groups_are_never_served_to_other_nodes(node, node_token):
    await sync_to_async(hold)(node)
    socket = await open_socket(node_token)
    welcome = await ask(socket, {"type": "hello", "v": 1, "ref": "h"})
    proved, plain = challenged_group(welcome["challenge"], 2), make_group(index=77)
    reply = await ask(socket, share_frame(proved, plain, ref="s"))
    assert sorted(reply["accepted"]) == sorted([proved["id"], plain["id"]])
    for group in (proved, plain):
        assert await sync_to_async(stored)(group["id"]) == ("unaudited", "node_held", False)

    honest, honest_token = await sync_to_async(make_node_with_token)(name="honest")
    other = await open_socket(honest_token)
    served = make_group(index=78)
    assert (await ask(other, share_frame(served, ref="s")))["accepted"] == [served["id"]]
    _, reader_token = await sync_to_async(make_node_with_token)(name="reader")
    reader = await open_socket(reader_token)
    for _ in range(3):
        reply = await ask(reader, {"type": "sample", "v": 1, "n": 8})
        assert [g["id"] for g in reply["rollouts"]] == [served["id"]]
    for s in (socket, other, reader):
        await s.disconnect()


@pytest.mark.django_db
def test_a_group_stored_as_its_nodes_hold_began_leaves_sampling(node):
    # The pool asked for holds before the INSERT and the audit failed in between: the audits' after-insert
    # pass takes the group out of sampling as it marks it.
    hold(node)
    group = pending_group(node, weights="77" * 32)
    assert stored(group.id) == ("pending", "", True)
    assert selection.groups_stored(inserted={group.id}) == {}
    assert stored(group.id) == ("unaudited", "node_held", False)
    assert sampled(make_node(owner=node.owner, name="reader"), 8) == []


@pytest.mark.django_db
def test_moderation_and_release_do_not_return_a_held_period_group_to_sampling(node, admin_user):
    hold(node)
    challenge = challenges.challenge_mint(node.id)
    proved, plain = challenged_group(challenge, 1), make_group(index=91)
    rollout_share(
        node=node, rollouts=[to_rollout_in(proved), to_rollout_in(plain)], catalogue=SAPO, swarm=default_swarm()
    )
    ids = [proved["id"], plain["id"]]
    rollout_set_moderation(rollouts=ids, status=ModerationStatus.QUARANTINED)
    rollout_set_moderation(rollouts=ids, status=ModerationStatus.OK)
    assert [stored(i) for i in ids] == [("unaudited", "node_held", False)] * 2

    assert node_release(actor=admin_user, node_id=node.id) == 1
    after = make_group(index=92)
    rollout_share(node=node, rollouts=[to_rollout_in(after)], catalogue=SAPO, swarm=default_swarm())
    assert [stored(i) for i in ids] == [("unaudited", "node_held", False)] * 2
    assert stored(after["id"]) == ("unaudited", "", True)  # served again, as any old client's group
    reader = make_node(owner=node.owner, name="reader")
    assert [g["id"] for g in sampled(reader, 8)] == [after["id"]]
