"""Challenges and proofs of work over the node socket (pool.challenges; docs/protocol.md, "Proof of
work"): the server chooses the questions, and a group's credit waits for an audit only when it answers
one the server issued to its node, once."""

from __future__ import annotations

import time

import pytest
from channels.db import database_sync_to_async as sync_to_async
from factories import make_node_with_token
from node_sockets import ask, open_socket
from support.pool import challenged_group, make_group, proof_of, share_frame

from pool import challenges
from pool.models import Rollout, RolloutText
from sapo_node import proof

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]


async def _welcome(socket) -> dict:
    welcome = await ask(socket, {"type": "hello", "v": 1, "ref": "h"})
    assert welcome["type"] == "welcome", welcome
    return welcome


async def _stored(group_id: str) -> tuple[str, str, str | None, dict | None]:
    row = await sync_to_async(Rollout.objects.with_texts().get)(id=group_id)
    return row.audit_state, row.audit_reason, row.proof_weights, row.proof


async def test_a_group_answering_its_nodes_challenge_is_pending_with_its_proof_stored(node, node_token):
    socket = await open_socket(node_token)
    challenge = (await _welcome(socket))["challenge"]
    assert challenge.startswith(f"c1.{node.id}.") and len(challenge) <= proof.MAX_CHALLENGE_CHARS
    group = challenged_group(challenge, 3)
    reply = await ask(socket, share_frame(group, ref="s"))
    assert reply["accepted"] == [group["id"]] and reply["challenge"] == challenge  # within the 20 s: the same one
    state, reason, weights, stored = await _stored(group["id"])
    assert (state, reason, weights) == ("pending", "", "ab" * 32)
    assert stored == group["proof"]
    await socket.disconnect()


async def test_an_old_clients_group_without_proof_is_accepted_as_before_and_unaudited(node, node_token):
    socket = await open_socket(node_token)
    group = make_group()
    reply = await ask(socket, share_frame(group, ref="s"))
    assert reply["accepted"] == [group["id"]] and reply["rejected"] == []
    assert await _stored(group["id"]) == ("unaudited", "", None, None)
    row = await sync_to_async(Rollout.objects.get)(id=group["id"])
    assert row.verdict == "accepted" and row.sampleable
    await socket.disconnect()


def _forged(challenge: str) -> str:
    last = challenge[-1]
    return challenge[:-1] + ("0" if last != "0" else "1")


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("expired", "expired_challenge"),
        ("foreign", "foreign_challenge"),
        ("forged", "bad_mac"),
        ("made_up", "bad_mac"),
        ("seed_chosen", "seed_not_issued"),
        ("index_chosen", "index_not_issued"),
        ("own_model", "model_not_auditable"),
    ],
)
async def test_a_proof_that_fails_its_challenge_is_stored_unaudited_with_the_reason(node, node_token, case, reason):
    socket = await open_socket(node_token)
    issued = (await _welcome(socket))["challenge"]
    if case == "expired":
        challenge = challenges.challenge_mint(node.id, now=time.time() - 86_400 - 60)
    elif case == "foreign":
        other, _ = await sync_to_async(make_node_with_token)(name="other")
        challenge = challenges.challenge_mint(other.id)
    elif case == "forged":
        challenge = _forged(issued)
    elif case == "made_up":
        challenge = "my own questions"
    else:
        challenge = issued
    group = challenged_group(challenge)
    if case == "seed_chosen":
        group = make_group(seed=proof.task_seed(challenge) + 1, index=proof.task_index(challenge, 0))
        group["proof"] = proof_of(group, challenge)
    elif case == "index_chosen":
        group = make_group(seed=proof.task_seed(challenge), index=12)
        group["proof"] = proof_of(group, challenge)
    elif case == "own_model":  # no site can rebuild it, so no audit could ever check it or hold the node
        group["proof"]["model"] = "Qwen/Qwen2.5-0.5B-Instruct"
    reply = await ask(socket, share_frame(group))
    # Not refused: stored, accepted, earning no credit (an honest node offline for a day sends the same).
    assert reply["accepted"] == [group["id"]], reply
    state, stored_reason, weights, stored = await _stored(group["id"])
    assert (state, stored_reason) == ("unaudited", reason)
    assert weights == "ab" * 32 and stored == group["proof"]
    await socket.disconnect()


async def test_a_question_of_a_challenge_is_answered_once(node, node_token):
    socket = await open_socket(node_token)
    challenge = (await _welcome(socket))["challenge"]
    first, again_in_share = challenged_group(challenge, 5), challenged_group(challenge, 5, right=1, wrong=3)
    other = challenged_group(challenge, 6)
    await ask(socket, share_frame(first, again_in_share, other))
    assert (await _stored(first["id"]))[:2] == ("pending", "")
    assert (await _stored(again_in_share["id"]))[:2] == ("unaudited", "repeated_question")
    assert (await _stored(other["id"]))[:2] == ("pending", "")
    # On another socket of the node, later: still answered.
    second = await open_socket(node_token)
    later = challenged_group(challenge, 5, right=3, wrong=1)
    reply = await ask(second, share_frame(later))
    assert reply["accepted"] == [later["id"]]
    assert (await _stored(later["id"]))[:2] == ("unaudited", "repeated_question")
    # The same group sent again (a resend) keeps its verdict and its state.
    await ask(second, share_frame(first))
    assert (await _stored(first["id"]))[:2] == ("pending", "")
    assert await sync_to_async(Rollout.objects.count)() == 4
    await socket.disconnect()
    await second.disconnect()


async def test_acks_carry_a_fresh_challenge_at_most_once_per_period(node, node_token, settings):
    settings.SAPO_CHALLENGE_SECONDS = 3600
    socket = await open_socket(node_token)
    first = (await _welcome(socket))["challenge"]
    acks = [await ask(socket, share_frame(make_group(index=i))) for i in range(3)]
    assert [ack["challenge"] for ack in acks] == [first] * 3
    assert (await _welcome(socket))["challenge"] == first
    settings.SAPO_CHALLENGE_SECONDS = 0
    fresh = await open_socket(node_token)
    seen = {(await _welcome(fresh))["challenge"]}
    for i in range(3):
        seen.add((await ask(fresh, share_frame(make_group(index=10 + i))))["challenge"])
    assert len(seen) == 4 and first not in seen
    for challenge in seen:
        assert challenges.challenge_fault(challenges.challenge_read(challenge), node.id, time.time(), 86_400) == ""
    await socket.disconnect()
    await fresh.disconnect()


@pytest.mark.parametrize(
    "change",
    [
        {"tokens": ["not base64!"] * 4},
        {"logprobs": [proof.encode_floats([-0.25] * 4)] * 4},  # 4 log-probabilities for 5 tokens
        {"logprobs": [proof.encode_floats([-0.25, 0.5, -0.25, -0.25, -0.25])] * 4},  # a probability above 1
        {"tokens": [proof.encode_ids([1] * 5)] * 3},  # 3 entries for 4 completions
        {"weights": "AB" * 32},
        {"temperature": 11},
        {"challenge": "c" * 129},
        {"model": "m" * 201},
    ],
)
async def test_a_malformed_proof_is_invalid_message_and_stores_nothing(node_token, change):
    socket = await open_socket(node_token)
    challenge = (await _welcome(socket))["challenge"]
    group = challenged_group(challenge)
    group["proof"].update(change)
    reply = await ask(socket, share_frame(group, ref="bad"))
    assert reply["type"] == "error" and reply["code"] == "invalid_message" and reply["ref"] == "bad", reply
    assert "proof" in reply["detail"]
    assert await sync_to_async(Rollout.objects.count)() == 0
    assert await sync_to_async(RolloutText.objects.count)() == 0
    await socket.disconnect()


async def test_a_samples_reply_carries_each_groups_proof(node, node_token):
    socket = await open_socket(node_token)
    challenge = (await _welcome(socket))["challenge"]
    group = challenged_group(challenge, 1)
    plain = make_group(index=99)
    await ask(socket, share_frame(group, plain))
    _, other_token = await sync_to_async(make_node_with_token)(name="reader")
    reader = await open_socket(other_token)
    reply = await ask(reader, {"type": "sample", "v": 1, "n": 8})
    by_id = {g["id"]: g for g in reply["rollouts"]}
    assert by_id[group["id"]]["proof"] == group["proof"]
    assert by_id[plain["id"]]["proof"] is None
    await socket.disconnect()
    await reader.disconnect()


async def test_a_question_answered_twice_at_once_earns_the_later_answer_nothing(node, node_token, monkeypatch):
    """Two shares of a node stored at the same moment (two sockets, two server processes) do not see
    each other when each is checked: as if so (the pool's lookup finding nothing), the later stored of
    two answers to one question is still made unaudited once both are stored, the earlier kept."""
    monkeypatch.setattr(challenges, "_answered_before", lambda candidates: set())
    socket = await open_socket(node_token)
    challenge = (await _welcome(socket))["challenge"]
    first, second = challenged_group(challenge, 2), challenged_group(challenge, 2, right=1, wrong=3)
    await ask(socket, share_frame(first))
    other = await open_socket(node_token)
    reply = await ask(other, share_frame(second))
    assert reply["accepted"] == [second["id"]]
    assert (await _stored(first["id"]))[:2] == ("pending", "")
    assert (await _stored(second["id"]))[:2] == ("unaudited", "repeated_question")
    # Settled again from the earlier group's side (its batch finishing last): nothing changes.
    assert await sync_to_async(challenges.repeats_settle)([first["id"]]) == set()
    assert (await _stored(first["id"]))[:2] == ("pending", "")
    await socket.disconnect()
    await other.disconnect()


def test_settling_a_pair_demotes_the_later_whichever_side_settles(node):
    """Both groups stored pending before either settled: the earlier's settle demotes the later."""
    from support.pool import to_rollout_in

    from pool.ingest_statement import ScreenedShare, SwarmOfBatch, insert_batch
    from pool.verification import verify_rollout
    from sapo_node.tasks import CATALOGUES
    from swarms.services import swarm_default_ensure

    swarm = swarm_default_ensure()
    challenge = challenges.challenge_mint(node.id)
    ids = []
    for right in (2, 3):
        group = to_rollout_in(challenged_group(challenge, 4, right=right, wrong=1))
        check = verify_rollout(group, CATALOGUES["sapo"])
        audits = {group.id: challenges.PENDING}
        insert_batch(
            [ScreenedShare(node, [group], {group.id: check}, set(), audits)],
            SwarmOfBatch(swarm.id, swarm.catalogue_version),
        )
        ids.append(group.id)
    assert set(Rollout.objects.filter(id__in=ids).values_list("audit_state", flat=True)) == {"pending"}
    assert challenges.repeats_settle([ids[0]]) == {ids[1]}
    states = dict(Rollout.objects.filter(id__in=ids).values_list("id", "audit_state"))
    assert states == {ids[0]: "pending", ids[1]: "unaudited"}
