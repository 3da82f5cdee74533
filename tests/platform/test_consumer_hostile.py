"""Hostile frames against the node WebSocket: nothing a node sends crashes its socket, every
frame gets a typed answer carrying its ref, and the storage budgets hold. In process, through the
ASGI application (WebsocketCommunicator, real PostgreSQL); tests/integration/test_hostile_frames.py
does the same over a real socket, fuzzed."""

from __future__ import annotations

import json
import time

import pytest
from channels.db import database_sync_to_async as sync_to_async
from node_sockets import ask, open_socket
from support.pool import make_group, share_frame

from nodes.presence import connection_counts
from pool.ingest_statement import REJECTED_KEEP_CHARS, REJECTED_KEEP_COMPLETIONS
from pool.models import NodeRound, NodeStorageHour, Rollout
from pool.seams import moderation

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]

HUGE = "9" * 401


def client_share(group: dict, ref: str) -> str:
    """A share frame as the node client writes it (protocol.frame: type, v, then ref)."""
    return json.dumps({"type": "share", "v": 1, "ref": ref, "rollouts": [group]})


def report(**fields) -> str:
    return json.dumps({"type": "report", "v": 1, "round": 1, **fields})


async def test_deep_nesting_and_huge_numbers_get_typed_errors_and_the_socket_lives_on(node, node_token):
    socket = await open_socket(node_token)
    deep = "[" * 10_000 + "]" * 10_000
    share = json.dumps(share_frame(make_group(), ref="s"))
    hostile = [
        # (frame text, expected code, expected ref)
        (deep, "invalid_json", None),
        ('{"type": "report", "v": 1, "ref": "d", "round": 1, "x": ' + deep + "}", "invalid_json", None),
        ('{"type": "hello", "v": 1, "ref": "n", "client": ' + "[" * 17 + "]" * 17 + "}", "invalid_json", None),
        (report(ref="r1").replace('"round": 1', f'"round": 1, "loss": {HUGE}'), "invalid_message", "r1"),
        (report(ref="r2").replace('"round": 1', f'"round": {HUGE}'), "invalid_message", "r2"),
        (report(ref="r3").replace('"round": 1', '"round": 1, "loss": NaN'), "invalid_message", "r3"),
        (report(ref="r4").replace('"round": 1', '"round": 1, "loss": -Infinity'), "invalid_message", "r4"),
        (report(ref="r5").replace('"round": 1', '"round": 1, "loss": 1e999'), "invalid_message", "r5"),
        (share.replace('"rewards": [1.0', f'"rewards": [{HUGE}'), "invalid_message", "s"),
        (share.replace('"index": 7', '"index": -' + "1" * 5000), "invalid_message", "s"),
        ('{"type": "sample", "v": 1, "ref": "q", "n": ' + "7" * 5000 + "}", "invalid_message", "q"),
        ('{"type": "sample", "v": 1, "ref": "t", "n": 1', "invalid_json", None),
        ('{"type": "hello", "v": 1, "ref": "u", "client": "\\ud800"}', "invalid_message", "u"),
        ('{"type": "hello", "v": 1, "ref": "z", "client": "a\\u0000b"}', "invalid_message", "z"),
        ('{"type": ' + HUGE + ', "v": 1, "ref": "k"}', "unknown_type", "k"),
    ]
    for text, code, ref in hostile:
        reply = await ask(socket, text)
        assert (reply["type"], reply["code"], reply.get("ref")) == ("error", code, ref), (text[:80], reply)
        assert "sys." not in reply["detail"] and "Traceback" not in reply["detail"], reply["detail"]
        assert len(reply["detail"]) < 300
    await socket.send_to(bytes_data=b'{"type": "sample", "v": 1, "ref": "b", "n": 1}')  # a binary frame
    assert (await socket.receive_json_from())["type"] == "samples"
    await socket.send_to(bytes_data=b"\xff\xfe junk")
    assert (await socket.receive_json_from())["code"] == "invalid_json"
    assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"  # still open
    assert await sync_to_async(Rollout.objects.count)() == 0
    assert await sync_to_async(NodeRound.objects.count)() == 0
    await socket.disconnect()
    assert await sync_to_async(connection_counts)([node.id]) == {}  # disconnect() ran


async def test_a_frame_a_little_too_large_is_answered_with_its_ref(node_token, settings):
    settings.SAPO_LIMITS = {"max_frame_bytes": 2000}
    socket = await open_socket(node_token)
    big = {"type": "hello", "v": 1, "ref": "big", "client": "x" * 150, "hardware": "y" * 3000}
    reply = await ask(socket, big)
    assert (reply["code"], reply["ref"]) == ("frame_too_large", "big")
    await socket.disconnect()


async def test_rate_limited_carries_the_ref(node, node_token, settings):
    settings.SAPO_LIMITS = {"max_messages_per_minute": 10}
    # moderation may scale the limit by the node's trust
    quota = (await sync_to_async(moderation().node_message_quotas)(node_ids=[node.id], base=10))[node.id]
    socket = await open_socket(node_token)
    for _ in range(quota):
        assert (await ask(socket, {"type": "sample", "v": 1, "n": 1}))["type"] == "samples"
    for ref in ("r1", "r2"):
        reply = await ask(socket, {"type": "sample", "v": 1, "n": 1, "ref": ref})
        assert (reply["type"], reply["code"], reply["ref"]) == ("error", "rate_limited", ref)
    # Over the rate a frame is refused unparsed: broken or not, it is `rate_limited`, and its ref is
    # still read from its first characters (where the node client writes it).
    reply = await ask(socket, '{"type": "sample", "ref": "r3", "n": ')
    assert (reply["code"], reply.get("ref")) == ("rate_limited", "r3")
    reply = await ask(socket, '{"type": "sample", "v": 1, "payload": {"ref": "nested"}, "ref": "late"}')
    assert (reply["code"], reply.get("ref")) == ("rate_limited", None)  # not provably top-level: no ref
    await socket.disconnect()


async def test_a_node_over_its_bytes_per_minute_is_refused_before_parsing_and_nothing_is_stored(
    node, node_token, settings
):
    from moderation.models import AuditEntry, ModerationFlag, RolloutFingerprint

    first = client_share(make_group(index=1), ref="first")
    settings.SAPO_LIMITS = {"max_bytes_per_minute": len(first) + 100}
    socket = await open_socket(node_token)
    assert (await ask(socket, first))["type"] == "ack"
    counts = [await sync_to_async(m.objects.count)() for m in (Rollout, RolloutFingerprint, ModerationFlag, AuditEntry)]
    over = client_share(make_group(index=2), ref="second")
    reply = await ask(socket, over)
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", "rate_limited", "second")
    assert "bytes" in reply["detail"]
    # Not parsed: a broken frame over the budget is refused for the budget, not as invalid JSON.
    assert (await ask(socket, '{"type": "share", "v": 1, "ref": "broken", "rollouts": [['))["code"] == "rate_limited"
    after = [await sync_to_async(m.objects.count)() for m in (Rollout, RolloutFingerprint, ModerationFlag, AuditEntry)]
    assert after == counts  # nothing of the refused frames was stored, moderation's records included
    await socket.disconnect()


async def test_the_bytes_per_minute_count_every_connection_of_the_node(node, node_token, settings):
    frame = client_share(make_group(index=1), ref="a")
    settings.SAPO_LIMITS = {"max_bytes_per_minute": len(frame) + 10}
    first, second = await open_socket(node_token), await open_socket(node_token)
    assert (await ask(first, frame))["type"] == "ack"
    reply = await ask(second, {"type": "sample", "v": 1, "ref": "b", "n": 1})  # small, but over together
    assert (reply["code"], reply["ref"]) == ("rate_limited", "b")
    await first.disconnect()
    await second.disconnect()


async def test_a_node_whose_frames_cost_its_cpu_budget_is_refused_until_it_is_paid_back(
    node, node_token, settings, monkeypatch
):
    from pool import ingest
    from sockets import ratelimit

    settings.SAPO_LIMITS = {"max_cpu_ms_per_minute": 1}
    verify = ingest.verify_rollout

    def verify_at_a_known_cost(*args, **kwargs):
        # A share costs its node at least 5 ms of server CPU, however fast the machine (a 1-group share
        # can cost under 1 ms, which a 1 ms budget pays back in seconds), so its debt is the deepest.
        started = time.thread_time()
        while time.thread_time() - started < 0.005:
            pass
        return verify(*args, **kwargs)

    monkeypatch.setattr(ingest, "verify_rollout", verify_at_a_known_cost)
    socket = await open_socket(node_token)
    assert (await ask(socket, client_share(make_group(index=1), ref="first")))["type"] == "ack"
    stored = await sync_to_async(Rollout.objects.count)()
    reply = await ask(socket, client_share(make_group(index=2), ref="second"))
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", "rate_limited", "second")
    assert "CPU" in reply["detail"]
    assert await sync_to_async(Rollout.objects.count)() == stored  # refused before any work
    # The bucket refills 1 ms a minute from its deepest debt (minus one minute's allowance): two
    # minutes on, the node may send again.
    budget = ratelimit.Budget(messages=10**6, bytes=10**9, cpu_ms=1)
    assert not await ratelimit.admit(node.id, budget, size=0, now=time.time() + 30)
    assert await ratelimit.admit(node.id, budget, size=0, now=time.time() + 150)
    await socket.disconnect()


async def test_an_unexpected_failure_is_internal_error_with_ref_and_presence_still_ends(node, node_token, monkeypatch):
    import sockets.consumers

    def broken(**kwargs):
        raise RuntimeError("a bug in a service")

    monkeypatch.setattr(sockets.consumers, "node_round_report", broken)
    socket = await open_socket(node_token)
    reply = await ask(socket, {"type": "report", "v": 1, "round": 1, "ref": "x"})
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", "internal_error", "x")
    assert "bug" not in reply["detail"]
    assert (await ask(socket, {"type": "hello", "v": 1}))["type"] == "welcome"
    await socket.disconnect()
    assert await sync_to_async(connection_counts)([node.id]) == {}


async def test_rejected_groups_are_stored_cut_short(node_token):
    socket = await open_socket(node_token)
    junk = make_group(right=3, wrong=3)
    junk["task"]["dataset"] = "made_up"
    junk["question"] = "q" * 5000
    junk["completions"] = ["c" * 8000] * 6
    reply = await ask(socket, share_frame(junk))
    assert reply["rejected"] == [{"id": junk["id"], "reason": "unknown_task"}]
    row = await sync_to_async(Rollout.objects.with_texts().get)(id=junk["id"])
    assert row.completion_count == 6 and len(row.completions) == REJECTED_KEEP_COMPLETIONS
    assert all(c.startswith("c" * REJECTED_KEEP_CHARS) and len(c) < REJECTED_KEEP_CHARS + 40 for c in row.completions)
    assert row.question.startswith("q" * REJECTED_KEEP_CHARS) and "cut: 5000 characters" in row.question
    assert row.claimed_rewards == junk["rewards"]
    stored = await sync_to_async(lambda: NodeStorageHour.objects.get().bytes)()
    assert 1500 < stored < 4000  # what was kept, not the 53,000 characters sent
    await socket.disconnect()


async def test_the_node_budget_stops_storage_for_the_hour(node, node_token, settings):
    settings.SAPO_LIMITS = {"max_stored_bytes_per_node_hour": 300}
    socket = await open_socket(node_token)
    first, second = make_group(index=1), make_group(index=2)
    assert (await ask(socket, share_frame(first)))["accepted"] == [first["id"]]  # crosses the budget: stored
    reply = await ask(socket, share_frame(second, ref="late"))
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", "over_budget", "late")
    assert "budget" in reply["detail"]
    reply = await ask(socket, {"type": "report", "v": 1, "round": 1, "ref": "rep"})
    assert (reply["code"], reply["ref"]) == ("over_budget", "rep")
    assert await sync_to_async(Rollout.objects.count)() == 1
    assert await sync_to_async(NodeRound.objects.count)() == 0
    assert (await ask(socket, {"type": "sample", "v": 1, "n": 1}))["type"] == "samples"  # reading goes on
    await socket.disconnect()


async def test_the_contributor_budget_counts_all_its_nodes(user, node_token, settings):
    from factories import make_node_with_token

    settings.SAPO_LIMITS = {"max_stored_bytes_per_contributor_hour": 300}
    _, sibling_token = await sync_to_async(make_node_with_token)(owner=user, name="desktop")
    _, stranger_token = await sync_to_async(make_node_with_token)(name="stranger")
    first, sibling, stranger = [await open_socket(t) for t in (node_token, sibling_token, stranger_token)]
    assert (await ask(first, share_frame(make_group(index=1))))["type"] == "ack"
    assert (await ask(sibling, share_frame(make_group(index=2))))["code"] == "over_budget"
    assert (await ask(stranger, share_frame(make_group(index=3))))["type"] == "ack"  # another contributor
    for socket in (first, sibling, stranger):
        await socket.disconnect()
