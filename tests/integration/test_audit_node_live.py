"""A real node (tiny-mini, the training loop, the WebSocketTransport) against the real platform
(daphne, the pool consumer, PostgreSQL): its round's questions are the server's challenge, each group
carries the proof of the weights it committed to, and the audit the server asks of its first weights
is answered by uploading the committed file before the run ends."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
from factories import make_node_with_token
from support.live_nodes import wait_for

from audits.models import Audit, AuditState
from pool.models import Rollout
from sapo_node import proof
from sapo_node.commitments import FOLDER
from sapo_node.config import NodeConfig
from sapo_node.loop import finish_node, play_round, start_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_a_round_under_the_servers_challenge_is_proved_and_its_audit_answered(
    swarm_servers, transports, tiny_mini_policy, tmp_path
):
    uploads = tmp_path / "uploads"
    with swarm_servers(settings={"SAPO_AUDIT_UPLOAD_DIR": uploads, "REDIS_URL": ""}) as server:
        node, token = make_node_with_token(name="audited-box")
        out = tmp_path / "node"
        transport = transports(server.ws_url + "/ws/node/", token, out / "outbox.sqlite3")
        config = NodeConfig(
            out=str(out),
            model="tiny-mini",
            seed=3,
            rounds=1,
            questions=4,
            generations=4,
            max_new_tokens=16,
            local=4,
            external=0,
            checkpoint_every=0,
            connect_wait=20,
            flush_wait=60,
        )
        policy = copy.deepcopy(tiny_mini_policy[0]), copy.deepcopy(tiny_mini_policy[1])
        running = start_node(config, transport, policy=policy)
        challenge = transport.challenge()
        assert challenge is not None  # the welcome's
        play_round(running)
        finish_node(running)  # waits for the verdicts and the upload

        stored = list(Rollout.objects.filter(node=node))
        assert len(stored) == 4
        assert {r.seed for r in stored} == {proof.task_seed(challenge)}
        assert {r.index for r in stored} == set(proof.task_indices(challenge)[:4])
        (weights,) = {r.proof_weights for r in stored}
        assert {r.audit_state for r in stored} <= {"pending", "audited"}  # valid proofs, none unaudited

        audit = Audit.objects.get(node=node)  # a node's first weights are always audited
        assert audit.weights == weights
        assert wait_for(lambda: Audit.objects.get(id=audit.id).state != AuditState.REQUESTED, timeout=30)
        audit.refresh_from_db()
        committed = Path(out / FOLDER / f"{weights}.safetensors")
        if audit.state == AuditState.UPLOADED:  # no worker here: the replay waits on the queue
            assert Path(audit.upload_path).read_bytes() == committed.read_bytes()
        assert audit.upload_sha256 == hashlib.sha256(committed.read_bytes()).hexdigest()
