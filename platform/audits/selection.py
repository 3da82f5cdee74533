"""Which weights are audited, decided once per weights digest of a node when its first groups are
stored (docs/audits.md, "Selection"): a node's first digest always; any later one with its model's
rate (`model_rate`: SAPO_AUDIT_RATE, less for a model whose audits cost more), times SAPO_AUDIT_BOOST for a node younger than a day, one the outlier rule flagged
and one in the top tenth of nodes by pending credit in the last hour. Drawn with `secrets`, so neither
the node nor anyone reading the code can tell which digest will be drawn.
"""

from __future__ import annotations

import math
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone
from psycopg import sql

from audits.models import Audit, AuditDraw, AuditGroup, AuditState, NodeHold
from figures import credit
from moderation.models import ModerationFlag
from nodes.models import Node
from pool.models import AuditReason, Rollout

#: A node's groups are `pending` when they carry a valid proof and no audit covered them yet.
PENDING = "pending"
UNAUDITED = "unaudited"
#: How long ago the first groups of a digest may be (a digest is one round's weights).
DIGEST_WINDOW = timedelta(days=1)
YOUNG = timedelta(days=1)
#: A node in this top fraction of pending credit in the last hour is audited more often.
TOP_FRACTION = 0.1
#: pool_rollout.audit_reason of a held node's group (its hold says why).
HELD_REASON = AuditReason.NODE_HELD.value
#: CPU-seconds one audit job costs, per model (docs/audits.md, "Cost": bench/audit_job.py, one torch
#: thread); the tiny-learn variants are tiny-mini's shape. A model not listed counts as the costliest.
JOB_SECONDS = {
    "tiny-mini": 0.07,
    "tiny-learn": 0.07,
    "tiny-learn-a": 0.07,
    "tiny-learn-b": 0.07,
    "tiny-sparse": 0.07,
    "tiny": 0.16,
    "smollm2-135m": 5.9,
}
#: A model whose job costs at most this many CPU-seconds is audited at SAPO_AUDIT_RATE; a costlier one
#: at that rate scaled down in proportion to its cost, to no less than MIN_RATE_SHARE of it, so the
#: audits' CPU per round stays near the tiny models' while a real model is still drawn often enough
#: (SmolLM2: the rate over 5.9, docs/audits.md).
FULL_RATE_SECONDS = 1.0
MIN_RATE_SHARE = 0.1


@dataclass(frozen=True)
class StoredDigest:
    """The groups of one node and one weights digest that a statement stored pending."""

    node_id: int
    weights: str
    model: str
    rollout_ids: list[uuid.UUID]


def stored_digests(inserted: Iterable[uuid.UUID]) -> list[StoredDigest]:
    rows = (
        Rollout.objects.filter(id__in=list(inserted), audit_state=PENDING)
        .exclude(proof_weights=None)
        .with_texts()
        .annotate(proof_model=KeyTextTransform("model", "_texts__proof"))
        .values_list("node_id", "proof_weights", "proof_model", "id")
        .order_by("node_id", "proof_weights", "id")
    )
    found: dict[tuple[int, str], StoredDigest] = {}
    for node_id, weights, model, rollout_id in rows:
        key = (node_id, weights)
        if key not in found:
            found[key] = StoredDigest(node_id, weights, model or "", [])
        found[key].rollout_ids.append(rollout_id)
    return list(found.values())


def held_node_ids(node_ids: Iterable[int]) -> set[int]:
    return set(NodeHold.objects.filter(node_id__in=list(node_ids), released_at=None).values_list("node_id", flat=True))


def top_pending_node_ids(*, now: datetime) -> set[int]:
    """The nodes in the top TOP_FRACTION (rounded down) by pending credit (the credit rule's reward of their pending
    groups) stored in the last hour. One aggregate over the hour's groups."""
    statement = sql.SQL(
        "SELECT r.node_id, sum({reward}) AS pending FROM pool_rollout r "
        "WHERE r.created_at >= %s AND r.audit_state = %s AND r.verdict = %s "
        "GROUP BY r.node_id ORDER BY pending DESC, r.node_id"
    ).format(reward=credit.reward("r"))
    with connection.cursor() as cursor:
        cursor.execute(statement, [now - timedelta(hours=1), PENDING, credit.ACCEPTED])
        rows = cursor.fetchall()
    top = math.floor(len(rows) * TOP_FRACTION)  # a tenth of 10 nodes or more: no node is the top of a few
    return {node_id for node_id, pending in rows[:top] if pending > 0}


def model_rate(model: str) -> float:
    """The chance that a later digest of `model` is drawn, before any boost: SAPO_AUDIT_RATES' for the
    model when it names one, else SAPO_AUDIT_RATE scaled by the model's job cost (JOB_SECONDS)."""
    named = settings.SAPO_AUDIT_RATES.get(model)
    if named is not None:
        return named
    seconds = JOB_SECONDS.get(model, max(JOB_SECONDS.values()))
    return settings.SAPO_AUDIT_RATE * max(MIN_RATE_SHARE, min(1.0, FULL_RATE_SECONDS / seconds))


def draw_probability(*, node: Node, first: bool, boosted: bool, model: str) -> float:
    if first:
        return 1.0
    rate = model_rate(model) * (settings.SAPO_AUDIT_BOOST if boosted else 1.0)
    return min(1.0, rate)


def drawn(probability: float) -> bool:
    """True with `probability`, from the operating system's randomness (53 bits)."""
    return secrets.randbits(53) < probability * (1 << 53)


def audit_wire(audit: Audit) -> dict[str, object]:
    """An audit as `ack.audits` and `welcome.audits` carry it (sapo_node.protocol.WireAudit)."""
    return {
        "id": str(audit.id),
        "weights": audit.weights,
        "upload": f"/api/v1/audits/{audit.id}/checkpoint",
        "deadline": int(audit.deadline.timestamp()),
    }


def groups_stored(*, inserted: set[uuid.UUID], now: datetime | None = None) -> dict[int, list[dict[str, object]]]:
    """After the pool stored `inserted`: a held node's pending groups (its hold began after the pool
    asked, pool.ingest._holds_apply) become unaudited and leave sampling; a digest with an
    open audit has its new groups added to it; any other digest is drawn, at every batch that adds
    groups to it, so a digest once spared is not safe to add made-up groups to (each later batch is
    drawn again). Returns the audits newly asked of each node (for its ack)."""
    digests = stored_digests(inserted)
    if not digests:
        return {}
    now = now or timezone.now()
    held = held_node_ids({d.node_id for d in digests})
    if held:
        ids = [i for d in digests if d.node_id in held for i in d.rollout_ids]
        Rollout.objects.filter(id__in=ids, audit_state=PENDING).update(
            audit_state=UNAUDITED, audit_reason=HELD_REASON, sampleable=False
        )
        digests = [d for d in digests if d.node_id not in held]
    asked: dict[int, list[dict[str, object]]] = {}
    boosted_cache: dict[str, set[int]] = {}
    for digest in digests:
        audit = Audit.objects.filter(
            node_id=digest.node_id, weights=digest.weights, state__in=AuditState.open()
        ).first()
        if audit is not None:
            _cover(audit, digest.rollout_ids)
            continue
        audit = _draw(digest, now=now, boosted_cache=boosted_cache)
        if audit is not None:
            asked.setdefault(digest.node_id, []).append(audit_wire(audit))
    return asked


def _boosted(node: Node, *, now: datetime, cache: dict[str, set[int]]) -> bool:
    if now - node.created_at < YOUNG:
        return True
    if ModerationFlag.objects.filter(node_id=node.id, rule="outlier", resolved_at=None).exists():
        return True
    if "top" not in cache:
        cache["top"] = top_pending_node_ids(now=now)
    return node.id in cache["top"]


def _draw(digest: StoredDigest, *, now: datetime, boosted_cache: dict[str, set[int]]) -> Audit | None:
    node = Node.objects.get(id=digest.node_id)
    first = not AuditDraw.objects.filter(node_id=node.id).exists()
    probability = draw_probability(
        node=node,
        first=first,
        boosted=not first and _boosted(node, now=now, cache=boosted_cache),
        model=digest.model,
    )
    chosen = drawn(probability)
    try:
        with transaction.atomic():
            AuditDraw.objects.create(
                node=node, weights=digest.weights, probability=probability, chosen=chosen, drawn_at=now
            )
            if not chosen:
                return None
            audit = Audit.objects.create(
                node=node,
                weights=digest.weights,
                model=digest.model,
                requested_at=now,
                deadline=now + timedelta(seconds=settings.SAPO_AUDIT_DEADLINE_SECONDS),
            )
    except IntegrityError:  # another process drew this digest at the same moment: its draw stands
        return None
    earlier = (
        Rollout.objects.filter(
            node_id=node.id, proof_weights=digest.weights, audit_state=PENDING, created_at__gte=now - DIGEST_WINDOW
        )
        .exclude(id__in=digest.rollout_ids)
        .values_list("id", flat=True)
    )
    _cover(audit, [*digest.rollout_ids, *earlier])
    return audit


def _cover(audit: Audit, rollout_ids: Iterable[uuid.UUID]) -> None:
    AuditGroup.objects.bulk_create(
        [AuditGroup(audit=audit, rollout_id=i) for i in rollout_ids], ignore_conflicts=True, batch_size=500
    )
