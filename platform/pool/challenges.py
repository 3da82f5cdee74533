"""Challenges: the server chooses each node's questions (docs/protocol.md, "Proof of work").

A challenge is an opaque string minted per node, `c1.<node id>.<issued ms>.<nonce>.<mac>`, the MAC an
HMAC-SHA256 (cut to 128 bits) over the rest with a key derived from SECRET_KEY: stateless to check,
and a node cannot make one. Its questions are sapo_node.proof's functions of it (the task seed
`task_seed(c)`, the indices `task_indices(c)`), so a node cannot pick easy or cheap ones.

The socket sends one in `welcome.challenge` and in each share's `ack.challenge`, a fresh one at most
once per SAPO_CHALLENGE_SECONDS (`SocketChallenge`): otherwise the ack repeats the current one, so a
node cannot shop among many. At ingest (pool.ingest, after verification) each accepted group with a
proof is checked (`proofs_check`): MAC, node, age (SAPO_CHALLENGE_TTL_SECONDS), seed, index, and that
the node had not answered the same question of the same challenge before. A group that passes is
`pending` (its credit waits for an audit); one that fails is stored `unaudited` with the reason (no
credit, never a refusal: an expired challenge is also what an honest node offline for a day sends).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
import secrets
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from pool.models import AuditReason, AuditState
from pool.records import RolloutIn
from pool.verification import Verification
from sapo_node import proof

VERSION = "c1"
_FORM = re.compile(r"c1\.([1-9][0-9]{0,18})\.([0-9]{1,15})\.([0-9a-f]{16})\.([0-9a-f]{32})")
#: Checked challenges kept (their MAC and seed), for the whole process: a node's challenge is checked
#: once per SAPO_CHALLENGE_SECONDS at most, not once per group.
CACHED_CHALLENGES = 2048

PENDING = (AuditState.PENDING.value, "")


@functools.cache
def _key(secret: str) -> bytes:
    return hmac.new(secret.encode(), b"sapo/challenge-key/v1", hashlib.sha256).digest()


def _mac(body: str) -> str:
    return hmac.new(_key(settings.SECRET_KEY), body.encode(), hashlib.sha256).hexdigest()[:32]


def challenge_mint(node_id: int, *, now: float | None = None) -> str:
    """A fresh challenge for the node, issued at `now` (unix seconds; None: the clock)."""
    issued_ms = int((time.time() if now is None else now) * 1000)
    body = f"{VERSION}.{int(node_id)}.{issued_ms}.{secrets.token_hex(8)}"
    return f"{body}.{_mac(body)}"


@dataclass(frozen=True)
class Challenge:
    """A challenge as read: whether its MAC is this server's, the node and time it was issued to and
    at, and its questions (None when the MAC is not valid: nothing else of it is trusted)."""

    valid: bool
    node_id: int = 0
    issued_ms: int = 0
    seed: int = 0


_FORGED = Challenge(valid=False)


@functools.lru_cache(maxsize=CACHED_CHALLENGES)
def challenge_read(challenge: str) -> Challenge:
    """What a challenge says, once its MAC is checked (cached: CACHED_CHALLENGES)."""
    match = _FORM.fullmatch(challenge)
    if match is None:
        return _FORGED
    body = challenge[: challenge.rindex(".")]
    if not hmac.compare_digest(_mac(body), match.group(4)):
        return _FORGED
    return Challenge(
        valid=True,
        node_id=int(match.group(1)),
        issued_ms=int(match.group(2)),
        seed=proof.task_seed(challenge),
    )


def challenge_fault(challenge: Challenge, node_id: int, now: float, ttl_seconds: int) -> str:
    """Why the node may not answer this challenge at `now`, or "" when it may."""
    if not challenge.valid:
        return AuditReason.BAD_MAC.value
    if challenge.node_id != node_id:
        return AuditReason.FOREIGN_CHALLENGE.value
    if now * 1000 - challenge.issued_ms > ttl_seconds * 1000:
        return AuditReason.EXPIRED_CHALLENGE.value
    return ""


class SocketChallenge:
    """A node socket's current challenge: a fresh one at most once per `every` seconds, else the
    current one again (`welcome.challenge`, `ack.challenge`)."""

    __slots__ = ("challenge", "every", "minted_at", "node_id")

    def __init__(self, node_id: int, every: float | None = None) -> None:
        self.node_id = node_id
        self.every = settings.SAPO_CHALLENGE_SECONDS if every is None else every
        self.challenge: str | None = None
        self.minted_at = 0.0

    def current(self) -> str:
        """The challenge to send now."""
        now = time.monotonic()
        if self.challenge is None or now - self.minted_at >= self.every:
            self.challenge, self.minted_at = challenge_mint(self.node_id), now
        return self.challenge


# Groups of the node that answered a question of a challenge before (any audit state but unaudited: a
# group that counted as the answer), found through pool_rollout_question_idx.
_ANSWERED_SQL = """
SELECT r.node_id, r.dataset, r.seed, r.index, r.id
FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) AS q(node, seed, index)
JOIN pool_rollout r ON r.node_id = q.node AND r.seed = q.seed AND r.index = q.index
WHERE r.audit_state <> 'unaudited'
"""


def proofs_check(
    shares: Sequence[tuple[Any, Sequence[RolloutIn], dict[uuid.UUID, Verification]]],
    *,
    now: float | None = None,
    ttl_seconds: int | None = None,
) -> list[dict[uuid.UUID, tuple[str, str]]]:
    """Per share (node, groups, verifications by id): (audit_state, audit_reason) by id of each
    accepted group that carries a proof, `pending` when its challenge is valid for the node and names
    its question for the first time, else `unaudited` with the first reason that applies. Groups not
    listed are stored unaudited with no reason (no proof, or rejected). One query for the whole batch
    (none when no group gets that far)."""
    now = time.time() if now is None else now
    ttl = settings.SAPO_CHALLENGE_TTL_SECONDS if ttl_seconds is None else ttl_seconds
    out: list[dict[uuid.UUID, tuple[str, str]]] = []
    candidates: list[tuple[int, uuid.UUID, RolloutIn, int]] = []  # (share, id, group, node id)
    for i, (node, rollouts, checks) in enumerate(shares):
        states: dict[uuid.UUID, tuple[str, str]] = {}
        seen: set[tuple[str, int, int]] = set()  # a question answered twice in this share
        for r in rollouts:
            if r.proof is None or not checks[r.id].accepted:
                continue
            challenge = challenge_read(r.proof.challenge)
            reason = challenge_fault(challenge, node.id, now, ttl)
            if not reason and r.seed != challenge.seed:
                reason = AuditReason.SEED_NOT_ISSUED.value
            if not reason and proof.question_number(r.proof.challenge, r.index) is None:
                reason = AuditReason.INDEX_NOT_ISSUED.value
            if not reason and (r.dataset, r.seed, r.index) in seen:
                reason = AuditReason.REPEATED_QUESTION.value
            if not reason and r.proof.model not in proof.AUDITABLE_MODELS:
                reason = AuditReason.MODEL_NOT_AUDITABLE.value
            if reason:
                states[r.id] = (AuditState.UNAUDITED.value, reason)
                continue
            seen.add((r.dataset, r.seed, r.index))
            states[r.id] = PENDING
            candidates.append((i, r.id, r, node.id))
        out.append(states)
    if candidates:
        answered = _answered_before(candidates)
        for i, rollout_id, r, node_id in candidates:
            if (node_id, r.dataset, r.seed, r.index) in answered:
                out[i][rollout_id] = (AuditState.UNAUDITED.value, AuditReason.REPEATED_QUESTION.value)
    return out


# The groups just stored pending whose question (node, dataset, seed, index) another group of the
# node also answers: of each such pair, the later stored (created_at, then id) becomes unaudited,
# whichever of the two batches settles it. proofs_check compares a share with the pool before it is
# stored; two shares of one node stored at the same moment (two sockets, two server processes) do not
# see each other there, and this runs after both are committed for the second at the latest.
_SETTLE_SQL = """
WITH mine AS (
    SELECT id, node_id, dataset, seed, index, created_at FROM pool_rollout
    WHERE id = ANY(%s::uuid[]) AND audit_state = 'pending'
), losers AS (
    SELECT CASE WHEN (o.created_at, o.id) > (m.created_at, m.id) THEN o.id ELSE m.id END AS id
    FROM mine m JOIN pool_rollout o ON o.node_id = m.node_id AND o.seed = m.seed AND o.index = m.index
         AND o.dataset = m.dataset AND o.id <> m.id AND o.audit_state <> 'unaudited'
)
UPDATE pool_rollout r SET audit_state = 'unaudited', audit_reason = %s
FROM losers l WHERE r.id = l.id AND r.audit_state = 'pending'
RETURNING r.id
"""


def repeats_settle(inserted: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    """After the statement that stored `inserted` (groups proofs_check made pending): of two groups of
    a node answering the same question of a challenge, the later stored is made unaudited
    (repeated_question), the earlier keeps its state. Returns the ids made unaudited."""
    if not inserted:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE_SQL, [list(inserted), AuditReason.REPEATED_QUESTION.value])
        return {row[0] for row in cursor.fetchall()}


def _answered_before(candidates: list[tuple[int, uuid.UUID, RolloutIn, int]]) -> set[tuple[int, str, int, int]]:
    """(node, dataset, seed, index) of the candidates' questions the pool holds an answer to already. A
    resent group (its own id stored) is not in the statement's answer for itself: the INSERT leaves it
    alone and its stored verdict is answered."""
    ids = {rollout_id for _, rollout_id, _, _ in candidates}
    params = [[c[3] for c in candidates], [c[2].seed for c in candidates], [c[2].index for c in candidates]]
    with connection.cursor() as cursor:
        cursor.execute(_ANSWERED_SQL, params)
        rows = cursor.fetchall()
    return {(node, dataset, seed, index) for node, dataset, seed, index, rollout_id in rows if rollout_id not in ids}
