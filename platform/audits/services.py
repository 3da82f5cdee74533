"""Writes on audits: an upload's progress, the worker's claim, and the outcomes (docs/audits.md).

Outcomes move the groups' audit state and, in the same transaction, the folded credit
(figures.stats.node_stats_apply_audit reads the old state first):
- pass: the audit's groups and every pending group of its node up to the digest's last group become
  `audited`;
- fail or expire: every pending group of the node (those since its last passed audit) becomes
  `failed` and leaves sampling, and the node is held for review (its new groups are stored unaudited
  and out of sampling) until staff release it;
- error (its job failed every attempt: the site's fault): nothing moves; its groups stay pending, and
  its upload is kept for staff to run it again (audits.jobs.audit_rerun) until the sweep's retention
  deletes it (`errored_uploads_expire`).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from accounts.models import User
from audits.models import Audit, AuditBase, AuditGroup, AuditState, NodeHold
from figures.stats import node_stats_apply_audit
from pool.models import Rollout

log = logging.getLogger(__name__)

PENDING, AUDITED, FAILED = "pending", "audited", "failed"
#: pool_rollout.audit_reason of a group an audit failed over (the audit row says why).
FAILED_REASON = "audit_failed"


def _set_audit_state(rollouts: QuerySet[Rollout], state: str, reason: str = "") -> int:
    node_stats_apply_audit(rollouts=rollouts, audit_state=state)
    if state == FAILED:
        return rollouts.update(audit_state=state, audit_reason=reason, sampleable=False)
    return rollouts.update(audit_state=state)


def audit_pass(*, audit_id: uuid.UUID, cpu_seconds: float, groups: int, tokens: int) -> Audit | None:
    """Close an uploaded audit as passed; None if it was not open any more (another job closed it)."""
    with transaction.atomic():
        audit = Audit.objects.select_for_update().filter(id=audit_id, state=AuditState.UPLOADED).first()
        if audit is None:
            return None
        last = Rollout.objects.filter(node_id=audit.node_id, proof_weights=audit.weights).aggregate(
            t=Max("created_at")
        )["t"]
        covered = Rollout.objects.filter(node_id=audit.node_id, audit_state=PENDING)
        covered = covered.filter(created_at__lte=last) if last else covered.filter(id__in=_group_ids(audit))
        # Groups of weights another open audit asks for wait for that audit: a pass of honest weights
        # must not credit made-up groups that a later draw has already caught.
        waiting = Audit.objects.filter(node_id=audit.node_id, state__in=AuditState.open()).exclude(id=audit.id)
        covered = covered.exclude(proof_weights__in=waiting.values("weights"))
        _set_audit_state(covered, AUDITED)
        _finish(audit, AuditState.PASSED, "", cpu_seconds=cpu_seconds, groups=groups, tokens=tokens)
    _delete_upload(audit)
    return audit


def audit_fail(
    *,
    audit_id: uuid.UUID,
    reason: str,
    state: str = AuditState.FAILED,
    cpu_seconds: float | None = None,
    groups: int = 0,
    tokens: int = 0,
    now: datetime | None = None,
) -> Audit | None:
    """Close an open audit as failed (or expired): the node's pending groups fail with it and the node
    is held for review. None if it was not open any more."""
    with transaction.atomic():
        audit = Audit.objects.select_for_update().filter(id=audit_id, state__in=AuditState.open()).first()
        if audit is None:
            return None
        pending = Rollout.objects.filter(node_id=audit.node_id, audit_state=PENDING)
        lost = _set_audit_state(pending, FAILED, FAILED_REASON)
        _finish(audit, state, reason, cpu_seconds=cpu_seconds, groups=groups, tokens=tokens, now=now)
        if not NodeHold.objects.filter(node_id=audit.node_id, released_at=None).exists():
            NodeHold.objects.create(node_id=audit.node_id, audit=audit, reason=reason, held_at=now or timezone.now())
        # Other open audits of the node have nothing left to decide: their groups failed with this one.
        for other in Audit.objects.filter(node_id=audit.node_id, state__in=AuditState.open()).exclude(id=audit.id):
            _finish(other, AuditState.FAILED, f"another audit of this node failed: {reason}", now=now)
            _delete_upload(other)
    log.warning(
        "audit %s of node %s %s: %s (%d groups lost their credit)", audit.id, audit.node_id, state, reason, lost
    )
    _delete_upload(audit)
    return audit


def audit_error(*, audit_id: uuid.UUID, reason: str, now: datetime | None = None) -> Audit | None:
    """Close an uploaded audit whose job keeps failing (SAPO_AUDIT_JOB_ATTEMPTS starts) as errored: the
    site's fault, not the node's. Its groups stay pending, for the node's next audit (a pass covers
    every pending group up to its digest's last one), and a new batch under its weights is drawn again;
    the node is not held. Its upload is kept, for staff to run it again once the fault is mended
    (audits.jobs.audit_rerun), within the retention of `errored_uploads_expire`. None if it was not
    uploaded any more."""
    with transaction.atomic():
        audit = Audit.objects.select_for_update().filter(id=audit_id, state=AuditState.UPLOADED).first()
        if audit is None:
            return None
        _finish(audit, AuditState.ERRORED, reason, now=now)
    log.error(
        "audit %s of node %s errored: %s (staff: the worker's log has the trace; its upload is kept to run it again)",
        audit.id,
        audit.node_id,
        reason,
    )
    return audit


def errored_uploads_expire(*, now: datetime | None = None) -> int:
    """Delete the uploads errored audits keep past SAPO_AUDIT_ERRORED_KEEP_SECONDS, and the oldest past
    SAPO_AUDIT_ERRORED_KEEP_BYTES in all (a fault that errors every audit must not fill the disk);
    their audits can no longer run again. Returns the uploads deleted."""
    now = now or timezone.now()
    oldest = now - timedelta(seconds=settings.SAPO_AUDIT_ERRORED_KEEP_SECONDS)
    kept = (
        Audit.objects.filter(state=AuditState.ERRORED)
        .exclude(upload_path="")
        .order_by("-finished_at")
        .values_list("id", "upload_path", "upload_size", "finished_at")
    )
    total, deleted = 0, 0
    for audit_id, path, size, finished_at in kept:
        total += size
        if finished_at >= oldest and total <= settings.SAPO_AUDIT_ERRORED_KEEP_BYTES:
            continue
        # The row first: an audit run again meanwhile is uploaded now, and keeps its file.
        if Audit.objects.filter(id=audit_id, state=AuditState.ERRORED, upload_path=path).update(upload_path=""):
            Path(path).unlink(missing_ok=True)
            deleted += 1
    return deleted


def node_release(*, actor: User, node_id: int) -> int:
    """Staff end a node's hold: its next groups with a valid proof are pending again. Its failed groups
    stay failed, and the groups it shared while held stay unaudited and out of sampling: they were made
    while its work was in question and no audit will cover them (docs/audits.md, "Outcomes"). Returns
    the holds released (0 or 1)."""
    return NodeHold.objects.filter(node_id=node_id, released_at=None).update(
        released_at=timezone.now(), released_by=actor
    )


def _group_ids(audit: Audit) -> list[uuid.UUID]:
    return list(AuditGroup.objects.filter(audit=audit).values_list("rollout_id", flat=True))


def _finish(
    audit: Audit,
    state: str,
    reason: str,
    *,
    cpu_seconds: float | None = None,
    groups: int = 0,
    tokens: int = 0,
    now: datetime | None = None,
) -> None:
    audit.state = state
    audit.reason = reason[:2000]
    audit.finished_at = now or timezone.now()
    audit.cpu_seconds = cpu_seconds
    audit.groups_replayed = groups
    audit.tokens_replayed = tokens
    audit.save(update_fields=["state", "reason", "finished_at", "cpu_seconds", "groups_replayed", "tokens_replayed"])


def _delete_upload(audit: Audit) -> None:
    """Uploads are deleted once their audit is decided (docs/audits.md)."""
    if audit.upload_path:
        for path in (Path(audit.upload_path), Path(audit.upload_path + ".part")):
            path.unlink(missing_ok=True)


def audit_base_record(*, model: str, digest: str) -> None:
    """A worker built `model` from the site's copy, whose float32 weights have `digest`: checkpoints of
    it may be uploaded as differences from it (audits.upload checks the base they name)."""
    AuditBase.objects.get_or_create(model=model, digest=digest)
