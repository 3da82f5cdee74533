"""Real nodes against the real platform on loopback: the node client's training
loop and WebSocketTransport, daphne running the pool consumer, PostgreSQL and Redis.

- two nodes with different models and tokenizers share groups, get them accepted with the rewards
  the server re-verified, and one trains on the other's groups (the server credits the author);
- a connection cut mid-stream, on the node's side (a proxy drops an ack, then cuts a frame in half)
  or the server's (daphne killed and restarted on the same port), loses and duplicates nothing, and
  the killed server's sockets leave no node "online" after the restart (presence);
- a revoked token closes the node's socket with 4401: the node stops retrying, says why, and trains on;
- `sapo-node run` stopped with Ctrl-C and resumed continues the round count, online.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import signal
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from factories import make_node_with_token
from support.live_nodes import wait_for
from support.pool import uuid7_time

from nodes.models import Node, NodeStatus
from nodes.presence import connected_node_ids, connection_counts, expires_after_seconds
from nodes.selectors import node_status
from pool.models import Consumption, NodeRound, NodeVerdictCounts, Rollout, Verdict
from pool.seams import moderation
from sapo_node import loop
from sapo_node.cli import main
from sapo_node.config import NodeConfig
from sapo_node.groups import Group
from sapo_node.loop import finish_node, play_round, start_node
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry, score_completion
from sapo_node.transport import Hello
from swarms.services import swarm_default_ensure

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

HELLO = Hello("sapo-node/integration", "tiny", "cpu", 4, 4)


# ---------------------------------------------------------------------------- helpers


def policy_copy(policy: tuple[Any, Any]) -> tuple[Any, Any]:
    return copy.deepcopy(policy[0]), copy.deepcopy(policy[1])


def node_config(out: Path, model: str, seed: int, **overrides: Any) -> NodeConfig:
    base = dict(
        out=str(out),
        model=model,
        seed=seed,
        rounds=0,
        questions=4,
        generations=4,
        max_new_tokens=16,
        local=4,
        external=4,
        checkpoint_every=0,
        connect_wait=10,
        flush_wait=20,
    )
    return NodeConfig(**(base | overrides))


def outbox_states(path: Path) -> dict[str, str]:
    """{group id: pending/accepted/rejected} as the node's outbox records them."""
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT id, state FROM outbox").fetchall())


def pool_ids(node: Node) -> list[str]:
    return [str(i) for i in Rollout.objects.filter(node=node).values_list("id", flat=True)]


def buffered(transport) -> int:
    """External groups that arrived and wait for the next round (the transport's sample buffer)."""
    with transport._lock:
        return len(transport._buffer)


def connections(node: Node) -> int:
    """Open sockets of the node, as presence records them."""
    return connection_counts([node.id]).get(node.id, 0)


def right_and_wrong_groups(n: int, seed: int) -> list[Group]:
    """n honest groups of basic_arithmetic: one right, one wrong and one untagged completion each,
    scored with the verifier the server uses (so every one is accepted and sampleable)."""
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    assert spec is not None
    groups = []
    for index in range(n):
        entry = build_entry(spec, seed, index)
        completions = [f"so <answer>{entry['answer']}</answer>", "<answer>nope</answer>", "no idea"]
        rewards = [score_completion(spec, seed, entry, c) for c in completions]
        assert rewards == [1.0, 0.0, 0.0]
        groups.append(
            Group.new(
                round=1,
                task=TaskRef(spec.dataset, seed, index),
                question=str(entry["question"]),
                answer=str(entry["answer"]),
                completions=completions,
                rewards=rewards,
            )
        )
    return groups


def assert_stored_exactly_once(node: Node, shared: list[Group]) -> None:
    ids = {g.id for g in shared}
    stored = pool_ids(node)
    assert len(stored) == len(set(stored)) == len(ids)  # no duplicates
    assert set(stored) == ids  # nothing lost, nothing extra
    assert set(Rollout.objects.filter(node=node).values_list("verdict", flat=True)) == {Verdict.ACCEPTED}
    counts = NodeVerdictCounts.objects.get(node=node)  # each group judged once, however often sent
    assert (counts.accepted_groups, counts.rejected_groups) == (len(ids), 0)


# ---------------------------------------------------------------------------- two real nodes


def test_two_nodes_share_get_accepted_and_train_on_each_others_groups(
    swarm_server, transports, tiny_policy, tiny_mini_policy, tmp_path
):
    node_a, token_a = make_node_with_token(name="tiny-box")
    node_b, token_b = make_node_with_token(name="mini-box")
    url = swarm_server.ws_url + "/ws/node/"

    # Node A (tiny) connects, takes the pool's catalogue and plays a round (another if none of its
    # groups had both right and wrong answers: only those are sampleable).
    ta = transports(url, token_a, tmp_path / "a" / "outbox.sqlite3")
    a = start_node(node_config(tmp_path / "a", "tiny", seed=1), ta, policy=policy_copy(tiny_policy))
    assert ta.status == "connected" and ta.node_name == "tiny-box"
    assert a.state.stream.catalogue.tasks == EASY_CATALOGUE.tasks  # the swarm's catalogue, from welcome
    assert wait_for(lambda: connections(node_a) == 1)
    stored_a = Node.objects.get(id=node_a.id)
    assert node_status(stored_a) == NodeStatus.ONLINE
    # What the node said in hello is written with the server's next presence beat (within 10 s).
    assert wait_for(lambda: Node.objects.get(id=node_a.id).model_id == "tiny")
    sampleable_a: set[str] = set()
    while not sampleable_a and a.last_round < 3:
        assert play_round(a) is not None and ta.flush(20)
        sampleable_a = {
            str(i) for i in Rollout.objects.filter(node=node_a, sampleable=True).values_list("id", flat=True)
        }
    assert sampleable_a, "tiny should answer some questions right and some wrong within 3 rounds"

    # Node B (tiny-mini, another tokenizer) connects; its transport samples A's groups from the pool.
    tb = transports(url, token_b, tmp_path / "b" / "outbox.sqlite3")
    b = start_node(node_config(tmp_path / "b", "tiny-mini", seed=4), tb, policy=policy_copy(tiny_mini_policy))
    assert wait_for(lambda: connections(node_b) == 1)
    assert node_status(Node.objects.get(id=node_b.id)) == NodeStatus.ONLINE
    assert connections(node_a) == 1  # both online at once
    assert wait_for(lambda: buffered(tb) >= min(len(sampleable_a), 4))
    row_b1 = play_round(b)
    assert row_b1 is not None
    assert row_b1["external_offered"] == min(len(sampleable_a), 4) and row_b1["external_invalid"] == 0
    assert row_b1["external_kept"] == row_b1["external_offered"]  # honest text re-scores the same, with signal
    assert row_b1["external_rescored"] == 0

    # Another round each: A may now train on B's groups too.
    row_a2, row_b2 = play_round(a), play_round(b)
    assert row_a2 is not None and row_b2 is not None
    assert ta.flush(20) and tb.flush(20)

    # Every shared group is in the pool once, accepted, with the rewards the server re-verified.
    for node, transport, n in ((node_a, ta, a), (node_b, tb, b)):
        states = outbox_states(n.out / "outbox.sqlite3")
        assert len(states) == 4 * n.last_round and set(states.values()) == {"accepted"}
        assert (transport.counts().accepted, transport.counts().pending) == (len(states), 0)
        rows = list(Rollout.objects.filter(node=node))
        assert {str(r.id) for r in rows} == set(states)
        for r in rows:
            assert r.verdict == Verdict.ACCEPTED and r.reason == ""
            assert r.verified_rewards == r.claimed_rewards and len(r.claimed_rewards) == 4
        assert sorted({r.round for r in rows}) == list(range(1, n.last_round + 1))

    # B's reports name what it trained on: the server credits A for each of A's groups B used.
    kept_b = row_b1["external_kept"] + row_b2["external_kept"]
    assert wait_for(lambda: NodeRound.objects.filter(node=node_b).count() == 2)
    assert wait_for(lambda: Consumption.objects.filter(consumer=node_b).count() == kept_b)
    used_by_b = Consumption.objects.filter(consumer=node_b)
    assert set(used_by_b.values_list("author_id", flat=True)) == {node_a.id}
    assert {str(c.rollout_id) for c in used_by_b} <= set(pool_ids(node_a))
    assert NodeRound.objects.get(node=node_b, round=1).figures["groups_external"] == row_b1["external_kept"]
    assert wait_for(lambda: NodeRound.objects.filter(node=node_a).count() == a.last_round)
    used_by_a = Consumption.objects.filter(consumer=node_a)  # A's last round took B's groups
    assert wait_for(lambda: used_by_a.count() == row_a2["external_kept"])
    assert set(used_by_a.values_list("author_id", flat=True)) <= {node_b.id}

    # Closing a node's transport takes it offline on the server.
    finish_node(a)
    finish_node(b)
    ta.close()
    assert wait_for(lambda: connections(node_a) == 0)
    assert node_status(Node.objects.get(id=node_a.id)) == NodeStatus.OFFLINE
    assert connections(node_b) == 1
    tb.close()
    assert wait_for(lambda: connections(node_b) == 0)
    assert node_status(Node.objects.get(id=node_b.id)) == NodeStatus.OFFLINE


# ---------------------------------------------------------------------------- cuts


def test_a_node_faster_than_its_frame_budget_is_paced_not_refused(swarm_servers, transports, tmp_path, caplog):
    """A node making rounds faster than its frame budget allows (a small model on a fast machine): it
    sends fewer, larger share frames and one report for the rounds made meanwhile, and the server
    never refuses it. Its budget is its trust's share of the configured 180 frames a minute (58 for a
    new node), and `welcome` announces that share, which it paces to. Unpaced, the same 60 rounds (a
    share and a report each, within ~2 s: 120 frames against a bucket of 58) are refused with
    rate_limited, then closed with 4429."""
    node, token = make_node_with_token(name="sprinter")
    limits = {"max_groups_per_message": 8, "max_messages_per_minute": 180}
    quota = moderation().node_message_quotas(node_ids=[node.id], base=180)[node.id]
    assert quota < 180 / 2  # a new node's
    groups = right_and_wrong_groups(60, seed=21)
    with (
        swarm_servers(settings={"SAPO_LIMITS": limits}) as server,
        caplog.at_level(logging.WARNING, logger="sapo_node.transport"),
    ):
        t = transports(server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
        t.start(HELLO)
        assert t.wait_connected(10)
        assert t.limits["max_messages_per_minute"] == quota
        for r, g in enumerate(groups):
            t.share([g])
            t.report({"round": r, "reward_mean": 0.5, "used": []})
            time.sleep(0.03)
        assert wait_for(lambda: t.counts().accepted == 60, timeout=90), t.counts()
        assert wait_for(lambda: NodeRound.objects.filter(node=node, round=59).exists(), timeout=30)
        assert t.share_frames <= 20  # 8 groups a frame when it could, not one frame a round
        t.close()  # before its server goes
    refusals = [r.getMessage() for r in caplog.records if "rate_limited" in r.getMessage() or "4429" in r.getMessage()]
    assert refusals == []
    assert NodeRound.objects.filter(node=node).count() < 60  # rounds made meanwhile: reported once


def test_a_connection_cut_mid_stream_loses_and_duplicates_nothing(swarm_server, transports, proxies, tmp_path):
    node, token = make_node_with_token(name="flaky-link")
    proxy = proxies(swarm_server.port)
    t = transports(proxy.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    t.start(HELLO)
    assert t.wait_connected(10)
    time.sleep(0.3)  # the first sample request goes out too
    preamble = proxy.history[0].up_bytes  # upgrade request, hello, sample: sent again on every connection
    groups = right_and_wrong_groups(40, seed=11)
    first, later = groups[:24], groups[24:]

    # Cut 1: the server stores what it got (3 frames of 8, the server's limit), the first ack is
    # dropped, the link is cut and new connections are refused for a while. The node learns of no
    # verdict, and shares more groups while it is cut off.
    proxy.cut_when("down", lambda conn, chunk: 0 if b'"for":"share"' in chunk else None, hold=True)
    t.share(first)
    assert wait_for(lambda: proxy.cuts == 1)
    t.share(later)
    assert wait_for(lambda: proxy.refused >= 1)  # the node tries to come back
    assert wait_for(lambda: len(pool_ids(node)) == 24)  # stored by the server...
    assert (t.counts().accepted, t.counts().pending) == (0, 40)  # ...not acknowledged: all still in the outbox

    # Cut 2: the next connection resends the 24 (oldest first), then dies in the middle of the first
    # frame of the 16 the server has never seen.
    def frame_bytes(groups: list[Group]) -> int:
        return len(json.dumps({"type": "share", "v": 1, "ref": "99", "rollouts": [g.to_wire() for g in groups]})) + 8

    cut_at = preamble + sum(frame_bytes(first[i : i + 8]) for i in (0, 8, 16)) + frame_bytes(later[:8]) // 2

    def mid_frame(conn, chunk: bytes) -> int | None:
        return cut_at - conn.up_bytes if conn.up_bytes + len(chunk) > cut_at else None

    proxy.cut_when("up", mid_frame, hold=True)
    proxy.release()
    assert wait_for(lambda: proxy.cuts == 2)
    time.sleep(0.3)  # what the server got before the cut is handled by now
    assert len(pool_ids(node)) == 24  # the half frame stored nothing
    assert t.counts().pending >= 16  # at least the groups the server never saw

    # Then the link holds: everything is delivered, once.
    proxy.release()
    assert t.flush(30)
    assert proxy.connections == 3
    assert t.share_frames >= 5 + 3  # the first 24 went out at least twice (and were stored once)
    assert_stored_exactly_once(node, groups)
    assert (t.counts().accepted, t.counts().rejected, t.counts().pending) == (40, 0, 0)
    assert t.outbox.pending() == []
    assert wait_for(lambda: connections(node) == 1)  # the cut sockets were counted out
    t.close()
    assert wait_for(lambda: connections(node) == 0)


def test_a_spool_of_uuid4_groups_from_an_older_client_is_stored_once(swarm_server, transports, tmp_path):
    """An outbox an older client filled with UUIDv4 ids: the group the pool already holds (its ack was
    lost) is acknowledged under its id and not stored again; the others are refused `bad_id`, given
    fresh UUIDv7 ids by the node and stored once under them."""
    import uuid

    from sapo_node.ids import is_uuid7

    node, token = make_node_with_token(name="old-spool")
    groups = right_and_wrong_groups(4, seed=23)
    for g in groups[:3]:
        g.id = str(uuid.uuid4())
    held = groups[0]
    Rollout.objects.create(
        id=held.id,
        node=node,
        swarm=swarm_default_ensure(),
        catalogue_version=1,
        round=1,
        dataset=held.task.dataset,
        seed=held.task.seed,
        index=held.task.index,
        completion_count=3,
        claimed_rewards=held.rewards,
        verified_rewards=held.rewards,
        verdict=Verdict.ACCEPTED,
        moderation_status="ok",
        has_variance=True,
        sampleable=False,
    )
    t = transports(swarm_server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    t.outbox.put([g.to_wire() for g in groups])
    t.start(HELLO)
    assert t.flush(30)
    assert (t.counts().accepted, t.counts().rejected, t.counts().pending) == (4, 0, 0)
    stored = pool_ids(node)
    assert len(stored) == 4 and held.id in stored and groups[3].id in stored
    assert not {g.id for g in groups[1:3]} & set(stored)
    assert all(is_uuid7(uuid.UUID(i)) for i in stored if i != held.id)
    assert set(outbox_states(tmp_path / "outbox.sqlite3")) == set(stored)
    t.close()


def test_a_node_whose_clock_is_ahead_makes_its_ids_by_the_server_s_clock(
    swarm_server, transports, tmp_path, monkeypatch
):
    """A machine whose clock runs 10 minutes ahead (past the 5 the server allows): the groups it queued
    before the welcome are refused `bad_id` and re-keyed by the server's clock, which the welcome gave
    it, so each is stored once instead of being refused and re-keyed for ever."""
    import uuid

    from sapo_node import ids

    real = time.time
    monkeypatch.setattr(ids, "_wall", lambda: real() + 600)
    monkeypatch.setattr(ids, "_clock_offset", 0.0)
    node, token = make_node_with_token(name="fast-clock")
    groups = right_and_wrong_groups(4, seed=29)
    for g in groups:
        g.id = str(ids.uuid7())  # what this machine makes before it hears the server
    assert all(uuid7_time(uuid.UUID(g.id)).timestamp() > real() + 590 for g in groups)
    t = transports(swarm_server.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    t.outbox.put([g.to_wire() for g in groups])
    t.start(HELLO)
    assert t.flush(30)
    assert (t.counts().accepted, t.counts().rejected, t.counts().pending) == (4, 0, 0)
    assert abs(ids._clock_offset + 600) < 30
    stored = pool_ids(node)
    assert len(stored) == 4 and not {g.id for g in groups} & set(stored)
    assert all(abs(uuid7_time(uuid.UUID(i)).timestamp() - real()) < 60 for i in stored)
    t.close()


def open_raw_node(stack: contextlib.ExitStack, url: str, token: str, group: Group):
    """A node that connects once (no reconnection), is welcomed and gets one group accepted."""
    from websockets.sync.client import connect

    ws = stack.enter_context(connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10))
    ws.send(json.dumps({"type": "hello", "v": 1, "client": "raw"}))
    assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
    ws.send(json.dumps({"type": "share", "v": 1, "rollouts": [group.to_wire()]}))
    assert json.loads(ws.recv(timeout=10))["accepted"] == [group.id]
    return ws


def get_json(url: str) -> Any:
    from urllib.request import urlopen

    with urlopen(url, timeout=20) as response:  # noqa: S310 - the test's own loopback server
        return json.loads(response.read())


def test_a_server_killed_mid_stream_and_restarted_loses_and_duplicates_nothing(swarm_servers, transports, tmp_path):
    node, token = make_node_with_token(name="survivor")
    ghosts = [make_node_with_token(name=f"ghost-{i}") for i in range(2)]  # connect once, never come back
    # Many frames' worth: some still unanswered when the server dies however fast it stores the first
    # (40 groups were all answered before the kill in some runs once a share took less CPU).
    groups = right_and_wrong_groups(400, seed=12)
    same_server = {"SAPO_SERVER_NAME": "killed-and-restarted"}
    with swarm_servers(settings=same_server) as first, contextlib.ExitStack() as raw:
        port = first.port
        url = first.ws_url + "/ws/node/"
        for (_, ghost_token), group in zip(ghosts, right_and_wrong_groups(2, seed=13), strict=True):
            open_raw_node(raw, url, ghost_token, group)
        t = transports(url, token, tmp_path / "outbox.sqlite3")
        t.start(HELLO)
        assert t.wait_connected(10)
        t.share(groups)
        assert wait_for(lambda: Rollout.objects.filter(node=node).exists(), timeout=20)
        assert {n.id for n, _ in ghosts} <= connected_node_ids()
        first.process.kill()  # SIGKILL: no goodbye, no disconnect(), open transactions die with it
        first.process.join(5)
    pending_at_kill = t.counts().pending
    assert pending_at_kill > 0  # the node was waiting for verdicts when the server died
    assert wait_for(lambda: t.status == "retrying")
    # Nobody ran disconnect(): the dead server's records are still there, until they expire...
    ghost_ids = {n.id for n, _ in ghosts}
    assert ghost_ids <= connected_node_ids()
    later = timezone.now() + timedelta(seconds=expires_after_seconds() + 1)
    assert not ghost_ids & connected_node_ids(now=later)

    # ...or until the server starts again, which forgets them before it serves anything.
    with swarm_servers(port=port, settings=same_server) as second:
        rows = get_json(second.url + "/api/v1/leaderboard/?view=nodes")["nodes"]
        status = {row["name"]: row["status"] for row in rows}
        assert status["ghost-0"] == status["ghost-1"] == NodeStatus.OFFLINE
        assert not ghost_ids & connected_node_ids()
        for ghost, _ in ghosts:
            assert node_status(Node.objects.get(id=ghost.id)) == NodeStatus.OFFLINE
        assert t.wait_connected(20)
        assert t.flush(30)
        assert_stored_exactly_once(node, groups)
        assert (t.counts().accepted, t.counts().pending) == (len(groups), 0)
        assert wait_for(lambda: connections(node) == 1)  # the node that came back is online again
        assert node_status(Node.objects.get(id=node.id)) == NodeStatus.ONLINE
        swarm = get_json(second.url + "/api/v1/swarm/")
        assert swarm["nodes_online"] == 1 and swarm["nodes_total"] == 3
        t.close()
        assert wait_for(lambda: connections(node) == 0)


# ---------------------------------------------------------------------------- refusal


def test_a_revoked_token_closes_with_4401_and_the_node_trains_on_alone(
    swarm_server, transports, proxies, tiny_policy, tmp_path, caplog
):
    from nodes.services import node_token_revoke

    node, token = make_node_with_token(name="soon-revoked")
    proxy = proxies(swarm_server.port)  # counts the node's connection attempts
    t = transports(proxy.ws_url + "/ws/node/", token, tmp_path / "outbox.sqlite3")
    n = start_node(
        node_config(tmp_path, "tiny", seed=5, questions=2, local=2, external=2), t, policy=policy_copy(tiny_policy)
    )
    assert t.status == "connected"
    assert play_round(n) is not None and t.flush(20)
    assert t.counts().accepted == 2

    node_token_revoke(node=node)  # closes the open socket (channel layer, on commit)
    assert wait_for(lambda: t.status == "refused (4401)")
    assert t.last_error == "closed with code 4401"
    assert "does not accept this token" in caplog.text and "not retrying" in caplog.text
    assert wait_for(lambda: connections(node) == 0)
    # The proxy also carried the audit's checkpoint upload (its first weights are always audited),
    # over HTTP to the same origin: what counts is that no connection came after the refusal.
    before = proxy.connections
    time.sleep(1.5)  # several backoff periods (0.05 .. 0.3 s): a retrying node would have come back
    assert (proxy.connections, proxy.refused) == (before, 0)
    assert t.status == "refused (4401)"

    # The node trains on in silo; what it shares waits in the outbox.
    row = play_round(n)
    assert row is not None and row["round"] == 2 and row["connection"] == "refused (4401)"
    assert row["local_offered"] == 2 and row["external_offered"] == 0
    assert (t.counts().accepted, t.counts().pending) == (2, 2)
    started = time.monotonic()
    finish_node(n)
    assert time.monotonic() - started < 5  # no waiting on a server that refused us (flush_wait is 20)
    assert not Rollout.objects.filter(node=node, round=2).exists()
    assert not NodeRound.objects.filter(node=node, round=2).exists()
    assert [r["round"] for r in n.metrics_log.read()] == [1, 2]


# ---------------------------------------------------------------------------- resume


def test_an_online_run_stopped_with_ctrl_c_resumes_the_round_count(swarm_server, tiny_policy, tmp_path, monkeypatch):
    node, token = make_node_with_token(name="resumer")
    out = tmp_path / "run"
    monkeypatch.setattr(loop, "load_model", lambda config: policy_copy(tiny_policy))
    monkeypatch.setenv("SAPO_TOKEN", token)
    monkeypatch.delenv("SAPO_SERVER", raising=False)
    real_score = loop.score_rollouts

    def score_then_interrupt(n, questions, generated):
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during round 2
        return real_score(n, questions, generated)

    monkeypatch.setattr(loop, "score_rollouts", score_then_interrupt)
    argv = [
        "run",
        "--server",
        swarm_server.ws_url + "/ws/node/",
        "--model",
        "tiny",
        "--out",
        str(out),
        "--questions",
        "2",
        "--generations",
        "4",
        "--max-new-tokens",
        "16",
        "--local",
        "2",
        "--external",
        "2",
        "--seed",
        "7",
        "--checkpoint-every",
        "0",
        "--connect-wait",
        "10",
        "--flush-wait",
        "20",
    ]
    assert main([*argv, "--rounds", "5"]) == 130

    monkeypatch.setattr(loop, "score_rollouts", real_score)
    # Settings from config.json; the server the token goes to is the user's to name, never the folder's.
    assert main(["run", "--resume", "--out", str(out), "--rounds", "3"]) == 2
    resume = ["run", "--resume", "--out", str(out), "--rounds", "3", "--server", swarm_server.ws_url + "/ws/node/"]
    assert main(resume) == 0

    rounds = [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [1, 2, 3]
    assert set(outbox_states(out / "outbox.sqlite3").values()) == {"accepted"}
    stored = Rollout.objects.filter(node=node)
    assert sorted(stored.values_list("round", flat=True)) == [1, 1, 2, 2, 3, 3]
    assert set(stored.values_list("verdict", flat=True)) == {Verdict.ACCEPTED}
    assert wait_for(lambda: sorted(NodeRound.objects.filter(node=node).values_list("round", flat=True)) == [1, 2, 3])
    assert wait_for(lambda: connections(node) == 0)  # each run closed its socket
