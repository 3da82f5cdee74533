"""Hostile nodes against the audits, every part real: the server (daphne, the pool consumer,
PostgreSQL), its checkpoint endpoint, and one audit worker process (`manage.py sapo_audit_worker`,
polling PostgreSQL) shared by the module. Each hostile node is a script speaking the protocol over a
WebSocket (hello, the welcome's challenge, shares, `ack.audits`, a `sample`, the upload endpoint),
beside an honest built-in node (`sapo_node.loop`, tiny-mini) where it matters:

1. the oracle: no model, reasoning-gym's answers in tags, a proof it makes up (a real tokenizer's ids,
   invented log-probabilities, the digest of real tiny-mini weights it uploads when asked);
2. a node that generates with tiny-mini and claims other weights of the same architecture;
3. a node that re-shares an honest node's groups from a `samples` reply;
4. a node that never uploads (a server of its own with a short SAPO_AUDIT_DEADLINE_SECONDS);
5. a node that changes one token of an honest completion.

A node that learns from its acks which weights digests were spared and adds made-up groups under one
meets a draw at each batch it adds (tests/platform/test_audit_selection.py, where the rate can change
between batches) and no pass of other weights credits groups an open audit asks about
(test_audit_outcomes.py).

What a user relies on is asserted: the audit's state and reason, the groups' audit state, no credit
for the cheater in the figures and the leaderboard, the honest node's audited credit, the cheater's
hold and its contributor's list of failed audits. Every case fails if the server credited a group on
acceptance: the cheater's credit would not be 0.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
from django.core.cache import cache
from django.db import connection
from factories import make_node_with_token
from safetensors.torch import save_file
from support.live_nodes import wait_for

from audits.jobs import EXPIRED_REASON, audit_sweep
from audits.models import Audit, AuditState, NodeHold
from audits.selectors import owner_failed_audits
from figures.leaderboard import leaderboard, node_figures_for
from nodes.models import Node
from pool.models import Rollout
from sapo_node import proof
from sapo_node.commitments import model_tensors, tensors_digest
from sapo_node.config import NodeConfig
from sapo_node.generate import encode_prompt, generate_groups, printable, stop_ids
from sapo_node.groups import make_proof
from sapo_node.ids import uuid7
from sapo_node.loop import finish_node, play_round, start_node
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE, build_entry, score_completion
from swarms.scope import SITE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
#: Leap years: tiny-mini answers about a third of them right, so its honest groups are worth something.
SPEC = EASY_CATALOGUE.get("calendar_arithmetic")
MODEL = "tiny-mini"
#: Completions per group and new tokens per completion of every generated group here.
G, NEW_TOKENS = 4, 16
#: The deadline of the never-uploading node's server: long enough for its checks before it.
SHORT_DEADLINE = 10


# ---------------------------------------------------------------------------- the site


@dataclass
class Site:
    server: Any
    uploads: Path
    worker_log: Path
    cache_dir: Path


def worker_env(uploads: Path, cache_dir: Path) -> dict[str, str]:
    db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": "",  # the worker takes uploaded audits from PostgreSQL, as under `make run`
        "SAPO_AUDIT_UPLOAD_DIR": str(uploads),
        "SAPO_AUDIT_MODEL_CACHE": str(cache_dir),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def site(swarm_servers, tiny_cache_dir, tmp_path_factory):
    """One server and one audit worker for the module's cases (each case's nodes are its own)."""
    folder = tmp_path_factory.mktemp("hostile")
    uploads, log = folder / "uploads", folder / "worker.log"
    # A node's first digest is always audited; any later one is spared (SAPO_AUDIT_RATE 0), as most
    # are at the default rate, so the probing oracle below knows its draw without luck.
    settings = {"SAPO_AUDIT_UPLOAD_DIR": uploads, "SAPO_AUDIT_MODEL_CACHE": tiny_cache_dir, "SAPO_AUDIT_RATE": 0.0}
    with swarm_servers(settings=settings) as server, open(log, "w") as out:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "sapo_audit_worker", "--poll", "0.3"],
            cwd=REPO,
            env=worker_env(uploads, tiny_cache_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield Site(server, uploads, log, tiny_cache_dir)
        finally:
            worker.terminate()
            worker.wait(20)


def decided(audit: Audit, *, site: Site, timeout: float = 120) -> Audit:
    """The audit once the worker decided it."""
    done = wait_for(lambda: Audit.objects.get(id=audit.id).state not in AuditState.open(), timeout=timeout)
    assert done, site.worker_log.read_text()[-3000:]
    return Audit.objects.get(id=audit.id)


# ---------------------------------------------------------------------------- a script speaking the protocol


class Script:
    """A node without the node client: frames over a real WebSocket, uploads over the real endpoint."""

    def __init__(self, server: Any, token: str) -> None:
        self.server, self.token = server, token
        self.refs = itertools.count()
        self.ws: Any = None
        self.welcome: dict[str, Any] = {}
        self.challenge: str | None = None
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> Script:
        from websockets.sync.client import connect

        self.ws = self.stack.enter_context(
            connect(
                self.server.ws_url + "/ws/node/",
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=30,
                max_size=None,
            )
        )
        self.welcome = self.request({"type": "hello", "client": "hostile/1", "model": MODEL}, "welcome")
        self.challenge = self.welcome["challenge"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def request(self, frame: dict[str, Any], kind: str) -> dict[str, Any]:
        ref = f"r{next(self.refs)}"
        self.ws.send(json.dumps({**frame, "v": 1, "ref": ref}))
        while True:
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("ref") == ref:
                assert reply["type"] == kind, reply
                return reply

    def share(self, groups: list[dict[str, Any]]) -> dict[str, Any]:
        ack = self.request({"type": "share", "rollouts": groups}, "ack")
        assert not ack.get("rejected"), ack
        assert sorted(ack["accepted"]) == sorted(g["id"] for g in groups), ack
        self.challenge = ack.get("challenge") or self.challenge
        return ack

    def sample(self, n: int) -> list[dict[str, Any]]:
        return self.request({"type": "sample", "n": n}, "samples")["rollouts"]

    def sample_some(self, n: int, tries: int = 20) -> list[dict[str, Any]]:
        """A sample that found something: trust weighting turns a new author's groups away at random,
        so a reply over a few fresh groups may be empty."""
        for _ in range(tries):
            if served := self.sample(n):
                return served
        return []

    def upload(self, asked: dict[str, Any], path: Path) -> dict[str, Any]:
        """The whole file in one chunk (a tiny-mini checkpoint is under the 8 MiB chunk bound)."""
        data = path.read_bytes()
        request = urllib.request.Request(
            self.server.url + asked["upload"],
            data=data,
            method="PUT",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}",
                "X-Checkpoint-Sha256": hashlib.sha256(data).hexdigest(),
            },
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())


# ---------------------------------------------------------------------------- groups


def questions(challenge: str, count: int, start: int = 0) -> list[tuple[int, int, dict[str, Any]]]:
    """(seed, index, entry) of the challenge's questions start..start+count-1."""
    seed = proof.task_seed(challenge)
    out = []
    for j in range(start, start + count):
        index = proof.task_index(challenge, j)
        out.append((seed, index, build_entry(SPEC, seed, index)))
    return out


def wire_group(seed: int, index: int, entry: dict[str, Any], completions: list[str], proof_: Any) -> dict[str, Any]:
    return {
        "id": str(uuid7()),
        "round": 1,
        "task": {"dataset": SPEC.dataset, "seed": seed, "index": index},
        "question": entry["question"],
        "answer": entry["answer"],
        "completions": completions,
        "rewards": [score_completion(SPEC, seed, entry, c) for c in completions],
        "proof": None if proof_ is None else msgspec.to_builtins(proof_),
    }


def commit(model: Any, path: Path) -> str:
    """The checkpoint file a node uploads, and the digest its proofs name."""
    tensors = model_tensors(model)
    save_file(tensors, str(path))
    return tensors_digest(tensors)


def generated(model: Any, tokenizer: Any, challenge: str, count: int, *, weights: str) -> list:
    """(wire group, its Generated) for `count` of the challenge's questions, drawn by the node's seeded
    sampler: the best of three times as many (a node shares the questions it likes among those issued)."""
    asked = questions(challenge, 3 * count)
    keys = [[proof.completion_key(challenge, SPEC.dataset, s, i, k) for k in range(G)] for s, i, _ in asked]
    prompts = [format_prompt(tokenizer, e["question"]) for _, _, e in asked]
    gens = generate_groups(
        model, tokenizer, prompts, generations=G, max_new_tokens=NEW_TOKENS, temperature=1.0, keys=keys
    )
    out = []
    for (seed, index, entry), gen in zip(asked, gens, strict=True):
        p = make_proof(
            challenge=challenge,
            weights=weights,
            model=MODEL,
            temperature=1.0,
            completion_ids=gen.completion_ids,
            logprobs=gen.logprobs,
        )
        out.append((wire_group(seed, index, entry, list(gen.texts), p), gen))
    best = sorted(range(len(out)), key=lambda i: -sum(out[i][0]["rewards"]))[:count]
    return [out[i] for i in sorted(best)]


def oracle_groups(tokenizer: Any, challenge: str, count: int, *, weights: str | None, start: int = 0) -> list:
    """The oracle's groups: reasoning-gym's answer in tags (one wrong, so each group has variance);
    with `weights`, a proof of a real tokenizer's ids and made-up log-probabilities."""
    groups = []
    for seed, index, entry in questions(challenge, count, start):
        texts = [f" <answer>{entry['answer']}</answer>"] * (G - 1) + [" <answer>?</answer>"]
        p = None
        if weights is not None:
            ids = [tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id] for t in texts]
            p = make_proof(
                challenge=challenge,
                weights=weights,
                model=MODEL,
                temperature=1.0,
                completion_ids=ids,
                logprobs=[[-0.05] * len(row) for row in ids],
            )
        groups.append(wire_group(seed, index, entry, texts, p))
    return groups


# ---------------------------------------------------------------------------- honest node, figures


def honest_node(server: Any, transports: Any, policy: tuple[Any, Any], out: Path, *, questions: int) -> Node:
    """A built-in node (sapo_node.loop, tiny-mini) for one round under the server's challenge; its
    first weights' audit is uploaded before it finishes."""
    node, token = make_node_with_token(name="honest")
    transport = transports(server.ws_url + "/ws/node/", token, out / "outbox.sqlite3")
    config = NodeConfig(
        out=str(out),
        model=MODEL,
        seed=3,
        rounds=1,
        questions=questions,
        generations=G,
        max_new_tokens=NEW_TOKENS,
        local=questions,
        external=0,
        checkpoint_every=0,
        connect_wait=20,
        flush_wait=60,
    )
    running = start_node(config, transport, policy=(copy.deepcopy(policy[0]), copy.deepcopy(policy[1])))
    play_round(running)
    finish_node(running)
    return node


def credit(*nodes: Node) -> dict[int, float]:
    """Each node's credit as the figures read it (the leaderboard's, /me/'s), uncached."""
    cache.clear()
    rows = Node.objects.filter(id__in=[n.id for n in nodes]).select_related("owner")
    figures = node_figures_for(list(rows))
    return {n.id: figures[n.id].verified_reward for n in nodes}


def board_credit() -> dict[int, float]:
    """The public leaderboard's nodes and their credit."""
    cache.clear()
    return {f.node_id: f.verified_reward for f in leaderboard(view="nodes", scope=SITE).page.object_list}


def audited_reward(node: Node) -> float:
    rows = Rollout.objects.filter(node=node, audit_state="audited").values_list("verified_rewards", flat=True)
    return sum(sum(r) for r in rows)


def states(node: Node, ids: list[str] | None = None) -> set[tuple[str, str]]:
    rows = Rollout.objects.filter(node=node)
    if ids is not None:
        rows = rows.filter(id__in=ids)
    return set(rows.values_list("audit_state", "audit_reason"))


def assert_caught(node: Node, audit: Audit, ids: list[str], *, rewarded: bool = True) -> None:
    """What a failed audit leaves: its groups failed and out of sampling, the node held, its
    contributor's page listing the audit, no credit. `rewarded`: the groups scored a reward when
    accepted (credited on acceptance, they would show in the figures)."""
    if rewarded:
        worth = Rollout.objects.filter(id__in=ids).values_list("verified_rewards", flat=True)
        assert sum(map(sum, worth)) > 0
    assert states(node, ids) == {("failed", "audit_failed")}
    assert not Rollout.objects.filter(id__in=ids, sampleable=True).exists()
    hold = NodeHold.objects.get(node=node, released_at=None)
    assert hold.audit_id == audit.id and hold.reason == audit.reason
    assert [a.id for a in owner_failed_audits(owner=node.owner)] == [audit.id]
    assert credit(node) == {node.id: 0.0}
    assert board_credit().get(node.id, 0.0) == 0.0


def the_audit(node: Node) -> Audit:
    (audit,) = Audit.objects.filter(node=node)
    return audit


# ---------------------------------------------------------------------------- the cases


def test_the_oracle_earns_nothing_while_the_honest_node_keeps_its_credit(site, transports, tiny_mini_policy, tmp_path):
    model, tokenizer = tiny_mini_policy
    honest = honest_node(site.server, transports, tiny_mini_policy, tmp_path / "honest", questions=8)
    oracle, oracle_token = make_node_with_token(name="oracle")
    bare, bare_token = make_node_with_token(name="oracle-without-proof")
    weights = commit(model, tmp_path / "tiny-mini.safetensors")  # real weights, never used to generate

    with Script(site.server, oracle_token) as script:
        first = oracle_groups(tokenizer, script.challenge, 6, weights=weights)
        ack = script.share(first)
        assert states(oracle, [g["id"] for g in first]) == {("pending", "")}
        (asked,) = ack["audits"]  # the node's first digest: always audited
        assert asked["weights"] == weights
        assert script.upload(asked, tmp_path / "tiny-mini.safetensors")["state"] == "uploaded"
        audit = decided(the_audit(oracle), site=site)
        assert audit.state == AuditState.FAILED
        assert "is not the seeded draw of the committed weights" in audit.reason, audit.reason
        # After its first audit: its later groups, whatever their proof, are stored unaudited.
        later = oracle_groups(tokenizer, script.challenge, 6, weights=weights, start=6)
        ack = script.share(later)
        assert not ack.get("audits")
        assert states(oracle, [g["id"] for g in later]) == {("unaudited", "node_held")}

    with Script(site.server, bare_token) as script:  # no proof at all: accepted, never credited
        groups = oracle_groups(tokenizer, script.challenge, 6, weights=None)
        assert not script.share(groups).get("audits")
        served = {g["id"] for g in script.sample_some(64)}
    assert states(bare) == {("unaudited", "")} and not Audit.objects.filter(node=bare).exists()
    assert served.isdisjoint(g["id"] for g in first)  # the failed groups left the pool's sampling

    assert_caught(oracle, audit, [g["id"] for g in first])
    assert credit(bare) == {bare.id: 0.0}
    honest_audit = decided(the_audit(honest), site=site)
    assert (honest_audit.state, honest_audit.reason) == (AuditState.PASSED, "")
    assert states(honest) == {("audited", "")}
    earned = audited_reward(honest)
    assert earned > 0  # tiny-mini answers some of the easy catalogue's questions
    assert credit(honest, oracle, bare) == {honest.id: pytest.approx(earned), oracle.id: 0.0, bare.id: 0.0}
    board = board_credit()
    assert board[honest.id] == pytest.approx(earned) and max(board, key=board.get) == honest.id


def test_a_node_claiming_other_weights_than_those_it_generated_with_fails(site, tiny_mini_policy, tmp_path):
    model, tokenizer = tiny_mini_policy
    torch.manual_seed(7)
    other = type(model)(model.config).eval()  # the same architecture, other weights (a fresh start)
    true_weights = commit(model, tmp_path / "generated-with.safetensors")
    other_weights = commit(other, tmp_path / "claimed.safetensors")
    assert true_weights != other_weights

    # (a) Its proofs name the other weights, and it uploads them: the digest holds, the replay does not.
    # (b) Its proofs name the weights it generated with, and it uploads the others: the digest fails.
    outcomes = {}
    for case, named in (("replay", other_weights), ("digest", true_weights)):
        node, token = make_node_with_token(name=f"claims-{case}")
        with Script(site.server, token) as script:
            groups = [g for g, _ in generated(model, tokenizer, script.challenge, 3, weights=named)]
            (asked,) = script.share(groups)["audits"]
            assert asked["weights"] == named
            script.upload(asked, tmp_path / "claimed.safetensors")
        outcomes[case] = (node, decided(the_audit(node), site=site), [g["id"] for g in groups])

    node, audit, ids = outcomes["replay"]
    assert audit.state == AuditState.FAILED and "is not the seeded draw" in audit.reason, audit.reason
    assert_caught(node, audit, ids)
    node, audit, ids = outcomes["digest"]
    assert audit.state == AuditState.FAILED and "weights_digest is not the digest" in audit.reason, audit.reason
    assert_caught(node, audit, ids)


def test_a_node_resharing_an_honest_nodes_groups_fails(site, transports, tiny_mini_policy, tmp_path):
    model, tokenizer = tiny_mini_policy
    honest = honest_node(site.server, transports, tiny_mini_policy, tmp_path / "honest", questions=8)
    copier, token = make_node_with_token(name="copier")
    base = commit(model, tmp_path / "tiny-mini.safetensors")  # the honest node's first round's weights

    with Script(site.server, token) as script:
        served = script.sample_some(64)
        assert served, "no honest group with variance to copy"
        assert {g["node"] for g in served} == {honest.name}
        # Verbatim under fresh ids: the proof names the honest node's challenge, so it earns nothing.
        verbatim = [{**g, "id": str(uuid7())} for g in served]
        for g in verbatim:
            del g["node"]
        script.share(verbatim)
        assert states(copier, [g["id"] for g in verbatim]) == {("unaudited", "foreign_challenge")}
        # The copied completions and proofs as answers to its own challenge's questions: pending,
        # audited, and the honest node's weights do not draw them under its own seeds.
        copied = []
        for g, (seed, index, entry) in zip(served, questions(script.challenge, len(served)), strict=False):
            p = {**g["proof"], "challenge": script.challenge}
            copied.append(wire_group(seed, index, entry, g["completions"], p))
        ack = script.share(copied)
        assert states(copier, [g["id"] for g in copied]) == {("pending", "")}
        (asked,) = ack["audits"]
        assert asked["weights"] == served[0]["proof"]["weights"] == base
        script.upload(asked, tmp_path / "tiny-mini.safetensors")
    audit = decided(the_audit(copier), site=site)
    assert audit.state == AuditState.FAILED and "is not the seeded draw" in audit.reason, audit.reason
    # The copied completions answer other questions than the copier's, so whether any scores a reward
    # under its questions is chance (a sample of two groups scored 0 in a CI run); the catch is not.
    assert_caught(copier, audit, [g["id"] for g in copied], rewarded=False)

    honest_audit = decided(the_audit(honest), site=site)
    assert honest_audit.state == AuditState.PASSED
    earned = audited_reward(honest)
    assert earned > 0 and credit(honest, copier) == {honest.id: pytest.approx(earned), copier.id: 0.0}


def test_a_node_that_never_uploads_fails_at_its_deadline_not_before(swarm_servers, tiny_mini_policy, tmp_path):
    model, tokenizer = tiny_mini_policy
    uploads = tmp_path / "uploads"
    settings = {"SAPO_AUDIT_UPLOAD_DIR": uploads, "SAPO_AUDIT_DEADLINE_SECONDS": SHORT_DEADLINE}
    node, token = make_node_with_token(name="never-uploads")
    with swarm_servers(settings=settings) as server:
        weights = commit(model, tmp_path / "mine.safetensors")
        with Script(server, token) as script:
            groups = [g for g, _ in generated(model, tokenizer, script.challenge, 3, weights=weights)]
            (asked,) = script.share(groups)["audits"]
        # Offline at audit time: the sweep leaves the audit open until its deadline.
        audit = the_audit(node)
        assert audit.deadline.timestamp() == pytest.approx(time.time() + SHORT_DEADLINE, abs=5)
        assert audit_sweep()["expired"] == 0
        assert Audit.objects.get(id=audit.id).state == AuditState.REQUESTED
        assert states(node) == {("pending", "")} and not NodeHold.objects.filter(node=node).exists()
        with Script(server, token) as script:  # back before the deadline: the welcome asks again
            assert [a["id"] for a in script.welcome["audits"]] == [asked["id"]]

        time.sleep(max(0.0, audit.deadline.timestamp() - time.time()) + 0.5)
        worker = subprocess.run(  # a worker sweeps as it starts
            [sys.executable, "manage.py", "sapo_audit_worker", "--burst"],
            cwd=REPO,
            env=worker_env(uploads, tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        audit.refresh_from_db()
        assert (audit.state, audit.reason) == (AuditState.EXPIRED, EXPIRED_REASON)
        assert_caught(node, audit, [g["id"] for g in groups])
        with Script(server, token) as script:
            assert script.welcome["audits"] == []


def test_a_node_that_changes_one_token_of_an_honest_completion_fails(site, tiny_mini_policy, tmp_path):
    model, tokenizer = tiny_mini_policy
    node, token = make_node_with_token(name="one-token")
    weights = commit(model, tmp_path / "mine.safetensors")
    with Script(site.server, token) as script:
        made = generated(model, tokenizer, script.challenge, 3, weights=weights)  # all replayed (SAPO_AUDIT_GROUPS 4)
        group, gen = made[0]
        ids = list(gen.completion_ids[0])
        # The token the model found least likely there (of those its sampler may draw), text and id
        # changed together, the claimed log-probability kept.
        prompt = encode_prompt(tokenizer, format_prompt(tokenizer, group["question"]))
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1]
        stops = stop_ids(model, tokenizer)
        special = set(tokenizer.all_special_ids) | stops
        candidates = [
            t
            for t in tokenizer.get_vocab().values()
            if t < logits.shape[0]
            and t not in special
            and printable(tokenizer.decode([t]))
            and tokenizer.decode([t]).strip()
        ]
        swapped = min(candidates, key=lambda t: float(logits[t]))
        assert swapped != ids[0]
        ids[0] = swapped
        text = tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True)
        assert text != group["completions"][0]
        group["completions"][0] = text
        seed, index = group["task"]["seed"], group["task"]["index"]
        group["rewards"][0] = score_completion(SPEC, seed, build_entry(SPEC, seed, index), text)
        group["proof"]["tokens"][0] = proof.encode_ids(ids)
        groups = [g for g, _ in made]
        (asked,) = script.share(groups)["audits"]
        script.upload(asked, tmp_path / "mine.safetensors")
    audit = decided(the_audit(node), site=site)
    assert audit.state == AuditState.FAILED, audit.reason
    assert f"group {group['id']}, completion 0: token 0 is not the seeded draw" in audit.reason, audit.reason
    assert_caught(node, audit, [g["id"] for g in groups])
