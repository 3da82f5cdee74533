"""The WebSocket transport's part in audits, against the stand-in server: it keeps the newest challenge
of welcomes and acks, names the weights of groups still waiting for a verdict, and holds a file an ack
asks to audit before the verdict releases it."""

from __future__ import annotations

import time
import uuid

import pytest
import torch
from fake_pool import FakePool

from sapo_node.commitments import CommitmentStore
from sapo_node.groups import Group, make_proof
from sapo_node.tasks import TaskRef
from sapo_node.transport import Hello
from sapo_node.transport.websocket import WebSocketTransport

HELLO = Hello("sapo-node/test", "tiny", "cpu", 2, 2)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def proven_group(i: int, weights: str) -> Group:
    group = Group.new(
        round=1, task=TaskRef("basic_arithmetic", 7, i), question="q", answer="a", completions=["x"], rewards=[1.0]
    )
    group.proof = make_proof(
        challenge="c-0",
        weights=weights,
        model="tiny",
        temperature=1.0,
        completion_ids=[[5, 2]],
        logprobs=[[-0.5, -0.1]],
    )
    return group


@pytest.fixture
def pool():
    pool = FakePool().start()
    yield pool
    pool.stop()


def test_the_newest_challenge_of_welcome_and_acks_is_the_transports(tmp_path, pool):
    pool.challenges = ["c-welcome", "c-ack"]
    transport = WebSocketTransport(pool.url, "good-token", tmp_path / "outbox.sqlite3", poll_interval=0.05)
    try:
        assert transport.challenge() is None
        transport.start(HELLO)
        wait_for(lambda: transport.challenge() == "c-welcome")
        transport.share([proven_group(1, "ab" * 32)])
        wait_for(lambda: transport.challenge() == "c-ack")
        transport.share([proven_group(2, "ab" * 32)])
        assert transport.flush(5) and transport.challenge() == "c-ack"  # an ack without one keeps it
    finally:
        transport.close()


def test_an_audit_the_server_asks_for_holds_the_file_the_verdict_would_release(tmp_path, pool):
    store = CommitmentStore(tmp_path / "commitments")
    digest = store.commit(torch.nn.Linear(4, 4)).digest
    audit_id = str(uuid.uuid4())
    transport = WebSocketTransport(pool.url, "good-token", tmp_path / "outbox.sqlite3", poll_interval=0.05)
    try:
        transport.answer_audits(store)
        transport.share([proven_group(1, digest)])  # before any connection: the group waits
        assert transport.unsettled_weights() == {digest}
        assert store.prune(keep=transport.unsettled_weights()) == []

        pool.audits = [
            {
                "id": audit_id,
                "weights": digest,
                "upload": f"/api/v1/audits/{audit_id}/checkpoint",
                "deadline": int(time.time()) + 600,
            }
        ]
        transport.start(HELLO)
        wait_for(lambda: transport.unsettled_weights() == set())  # acknowledged
        assert store.holds() == {audit_id: (digest, pytest.approx(time.time() + 600, abs=5))}
        assert store.prune(keep=transport.unsettled_weights()) == [] and store.path(digest) is not None
    finally:
        transport.close()
