"""Shared helpers for the audit tests (no tests here): pending groups as the pool stores them, audits,
and the audit worker as a separate process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection
from django.utils import timezone

from audits.models import Audit, AuditGroup
from nodes.models import Node
from pool.models import ModerationStatus, Rollout, RolloutText, Verdict
from sapo_node import proof
from sapo_node.ids import uuid7
from swarms.services import swarm_default_ensure

WEIGHTS = "ab" * 32
OTHER_WEIGHTS = "cd" * 32
REPO = Path(__file__).resolve().parents[2]
#: The challenge honest_groups answer, and the bytes per chunk `upload` sends.
CHALLENGE = "c1.test.audit"
CHUNK = 256 * 1024


def pending_group(
    node: Node,
    *,
    weights: str = WEIGHTS,
    rewards: tuple[float, ...] = (1.0, 0.0),
    created_at: datetime | None = None,
    audit_state: str = "pending",
    proof: dict | None = None,
    question: str = "What is 1 + 1?",
    completions: list[str] | None = None,
    dataset: str = "basic_arithmetic",
    seed: int = 1234,
    index: int | None = None,
) -> Rollout:
    """An accepted, sampleable group of `node` whose proof commits to `weights`."""
    created_at = created_at or timezone.now()
    n = Rollout.objects.count()
    rollout = Rollout.objects.create(
        id=uuid7(created_at),
        node=node,
        swarm=swarm_default_ensure(),
        catalogue_version=1,
        round=1,
        dataset=dataset,
        seed=seed,
        index=n if index is None else index,
        completion_count=len(rewards),
        claimed_rewards=list(rewards),
        verified_rewards=list(rewards),
        verdict=Verdict.ACCEPTED,
        moderation_status=ModerationStatus.OK,
        has_variance=len(set(rewards)) > 1,
        sampleable=len(set(rewards)) > 1,
        sample_seq=n + 1 if len(set(rewards)) > 1 else None,
        created_at=created_at,
        proof_weights=weights,
        audit_state=audit_state,
    )
    RolloutText.objects.create(
        rollout=rollout,
        swarm_id=rollout.swarm_id,
        created_at=created_at,
        question=question,
        answer="2",
        completions=completions or [f"<answer>{r}</answer>" for r in rewards],
        proof=proof or {"challenge": "c", "weights": weights, "model": "tiny-mini", "temperature": 1.0},
    )
    return rollout


def make_audit(
    node: Node, groups: list[Rollout] = (), *, weights: str = WEIGHTS, deadline_in: float = 3600, **fields
) -> Audit:
    now = timezone.now()
    audit = Audit.objects.create(
        node=node,
        weights=weights,
        model="tiny-mini",
        requested_at=now,
        deadline=now + timedelta(seconds=deadline_in),
        **fields,
    )
    AuditGroup.objects.bulk_create([AuditGroup(audit=audit, rollout=r) for r in groups])
    return audit


def mark_audited(node: Node) -> int:
    """The node's groups with a proof or without marked audited, as a passed audit would: for tests of
    the figures, which count audited work only (the audit itself is tested in test_audit_*)."""
    return Rollout.objects.filter(node=node, verdict=Verdict.ACCEPTED).update(audit_state="audited")


def audit_worker_env(**extra: str) -> dict[str, str]:
    """The environment of a worker process that shares the test's database, Redis queue (REDIS_URL and
    SAPO_REDIS_PREFIX as the test set them) and upload folder, plus `extra`."""
    db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": settings.REDIS_URL,
        "SAPO_REDIS_PREFIX": settings.SAPO_REDIS_PREFIX,
        "SAPO_AUDIT_UPLOAD_DIR": str(settings.SAPO_AUDIT_UPLOAD_DIR),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def run_audit_worker(env: dict[str, str], *, timeout: float) -> subprocess.CompletedProcess:
    """One `manage.py sapo_audit_worker --burst` process: it runs what is queued, then exits."""
    return subprocess.run(
        [sys.executable, "manage.py", "sapo_audit_worker", "--burst"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def honest_groups(model, tokenizer, node, digest: str, *, count: int = 2, tamper: bool = False) -> list[Rollout]:
    """Groups as an honest node makes them under CHALLENGE: seeded draws, their tokens and log-probs."""
    from sapo_node.generate import generate_groups  # torch: only the tests that generate pay for it
    from sapo_node.prompts import format_prompt

    questions = [f"What is {i} + {i + 2}?" for i in range(count)]
    keys = [[proof.completion_key(CHALLENGE, "basic_arithmetic", 77, i, k) for k in range(3)] for i in range(count)]
    generated = generate_groups(
        model,
        tokenizer,
        [format_prompt(tokenizer, q) for q in questions],
        generations=3,
        max_new_tokens=12,
        temperature=1.0,
        keys=keys,
    )
    groups = []
    for i, (question, g) in enumerate(zip(questions, generated, strict=True)):
        ids = [list(c) for c in g.completion_ids]
        if tamper and i == 0:
            ids[1][2] = (ids[1][2] + 1) % 50  # one token of one completion altered, text kept
        groups.append(
            pending_group(
                node,
                weights=digest,
                rewards=(1.0, 0.0, 0.5),
                question=question,
                completions=g.texts,
                seed=77,
                index=i,
                proof={
                    "challenge": CHALLENGE,
                    "weights": digest,
                    "model": "tiny-mini",
                    "temperature": 1.0,
                    "tokens": [proof.encode_ids(c) for c in ids],
                    "logprobs": [proof.encode_floats(lp) for lp in g.logprobs],
                },
            )
        )
    return groups


def upload(client, token: str, audit: Audit, data: bytes, *, status: int = 200) -> dict:
    """The checkpoint through the endpoint, CHUNK bytes at a time, as a node's transport sends it; the
    last chunk's answer (which must have `status`)."""
    sha = hashlib.sha256(data).hexdigest()
    answer = {}
    for first in range(0, len(data), CHUNK):
        body = data[first : first + CHUNK]
        headers = {
            "HTTP_AUTHORIZATION": f"Bearer {token}",
            "HTTP_CONTENT_RANGE": f"bytes {first}-{first + len(body) - 1}/{len(data)}",
        }
        if first + len(body) == len(data):
            headers["HTTP_X_CHECKPOINT_SHA256"] = sha
        response = client.put(
            f"/api/v1/audits/{audit.id}/checkpoint", data=body, content_type="application/octet-stream", **headers
        )
        answer = response.json()
        last = first + len(body) == len(data)
        assert response.status_code == (status if last else 200), answer
    return answer
