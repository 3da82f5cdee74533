"""The audit job: queued when an upload completes, run by a worker process, never on a socket's event
loop (docs/audits.md, "The worker").

The queue is RQ on the site's Redis (REDIS_URL). PostgreSQL stays the record: an audit is `uploaded`
until a job decides it, and a job first claims it (`started_at`, `attempts`), so
- a job lost before it ran (Redis restarted, the enqueue failed) or in the middle (the worker was
  killed) is queued again by the sweep (`audit_sweep`) once its lease has passed, up to
  SAPO_AUDIT_JOB_ATTEMPTS starts;
- a job queued twice runs once: the second finds the audit claimed or decided;
- a job that raises (a bug, a file the replay cannot handle) gives its claim back at once, for the
  sweep to queue again; the last attempt's failure, or a lost job with no attempt left, closes the
  audit `errored` (audits.services.audit_error: the site's fault, the node loses nothing), which keeps
  its upload for staff to run it again (`audit_rerun`).
Without REDIS_URL (one machine: `make run`) the worker takes uploaded audits from PostgreSQL itself.
The sweep also expires the audits whose deadline passed without an upload, and deletes the uploads
errored audits keep past their retention. It runs with the site's scheduled jobs (ops.scheduled) and in
every worker between jobs.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from accounts.models import User
from audits.models import Audit, AuditGroup, AuditState
from audits.services import audit_base_record, audit_error, audit_fail, audit_pass, errored_uploads_expire
from common.errors import ApplicationError
from pool.models import Rollout

log = logging.getLogger(__name__)

#: The RQ queue's name: namespaced like every Redis key of the deployment.
QUEUE = "audits"
#: The RQ function a job runs (a dotted path: the site never imports the worker's torch).
JOB_FUNCTION = "audits.jobs.audit_job"
EXPIRED_REASON = "no checkpoint was uploaded by the audit's deadline"
LOST_REASON = "the server lost its audit job ({attempts} attempts: a worker stopped); no credit is lost"
RAISED_REASON = "the server could not replay it ({error}, {attempts} attempts); no credit is lost"


def queue_name() -> str:
    return f"{settings.SAPO_REDIS_PREFIX}:{QUEUE}"


def redis_for_queue(*, blocking: bool = False):
    """A Redis client for RQ (bytes replies). The enqueueing side keeps the site's bounded timeouts;
    a worker's blocking wait for a job must not time out on its socket."""
    from redis import Redis

    timeout = settings.SAPO_REDIS_TIMEOUT_SECONDS
    return Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=timeout, socket_timeout=None if blocking else timeout
    )


def audit_enqueue(audit_id: uuid.UUID) -> bool:
    """Queue the audit's job (RQ; without Redis the workers poll PostgreSQL). Marks it queued first,
    so a failed enqueue is one the sweep retries. Returns whether Redis took the job."""
    Audit.objects.filter(id=audit_id, state=AuditState.UPLOADED).update(queued_at=timezone.now())
    if not settings.REDIS_URL:
        return False
    from rq import Queue

    try:
        Queue(queue_name(), connection=redis_for_queue()).enqueue(
            JOB_FUNCTION,
            str(audit_id),
            job_timeout=settings.SAPO_AUDIT_JOB_LEASE_SECONDS,
            result_ttl=3600,
            failure_ttl=86_400,
        )
    except Exception as exc:  # noqa: BLE001 - Redis down or hung: the sweep queues it again
        log.warning("audit %s: could not queue its job (%s); the sweep will", audit_id, exc)
        return False
    return True


def audit_enqueue_on_commit(audit_id: uuid.UUID) -> None:
    """Queue the job once the upload's transaction committed (a worker must find it `uploaded`)."""
    transaction.on_commit(lambda: audit_enqueue(audit_id))


def audit_rerun(*, audit_id: uuid.UUID, actor: User | None = None) -> Audit:
    """Staff run an errored audit again, on the upload it kept: it is `uploaded` again with its attempts
    at 0 and its job queued once this commits; its outcome is then decided as any audit's. Raises
    ApplicationError: `not_found`, `not_errored` (only an errored audit runs again), `upload_gone` (the
    retention deleted it, or the site lost it), `audit_open` (another audit of the node's weights is open:
    its outcome decides them)."""
    with transaction.atomic():
        audit = Audit.objects.select_for_update().filter(id=audit_id).first()
        if audit is None:
            raise ApplicationError("not_found", f"no audit {audit_id}", status=404)
        if audit.state != AuditState.ERRORED:
            raise ApplicationError(
                "not_errored", f"audit {audit.id} is {audit.state}: only an errored audit runs again"
            )
        if not audit.upload_path or not Path(audit.upload_path).is_file():
            raise ApplicationError("upload_gone", f"audit {audit.id}'s upload is deleted: the node uploads anew")
        if Audit.objects.filter(node_id=audit.node_id, weights=audit.weights, state__in=AuditState.open()).exists():
            raise ApplicationError("audit_open", f"another audit of these weights of node {audit.node_id} is open")
        audit.state, audit.reason, audit.attempts = AuditState.UPLOADED, "", 0
        audit.started_at = audit.queued_at = audit.finished_at = None
        try:
            with transaction.atomic():
                audit.save(update_fields=["state", "reason", "attempts", "started_at", "queued_at", "finished_at"])
        except IntegrityError:  # one opened for its weights meanwhile (audits_one_open)
            raise ApplicationError("audit_open", f"another audit of node {audit.node_id}'s weights opened") from None
        audit_enqueue_on_commit(audit.id)
    log.warning("audit %s of node %s run again by %s", audit.id, audit.node_id, actor or "manage.py")
    return audit


def audit_claim(audit_id: uuid.UUID, *, now: datetime | None = None) -> Audit | None:
    """Take the audit for this job: it must be uploaded, and not started within the lease by another
    job. One statement, so two jobs never both hold it."""
    now = now or timezone.now()
    lease = now - timedelta(seconds=settings.SAPO_AUDIT_JOB_LEASE_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audits_audit SET started_at = %s, attempts = attempts + 1 WHERE id = %s AND state = %s "
            "AND (started_at IS NULL OR started_at < %s) RETURNING id",
            [now, audit_id, AuditState.UPLOADED.value, lease],
        )
        claimed = cursor.fetchone()
    return Audit.objects.get(id=audit_id) if claimed else None


def audit_job(audit_id: str) -> str:
    """What an RQ worker runs (JOB_FUNCTION): claim the audit, replay it, record the outcome."""
    return audit_run(uuid.UUID(audit_id))


def audit_run(audit_id: uuid.UUID) -> str:
    """Replay an uploaded audit and record its outcome; returns a line for the log. A failure of the
    node's (its file, its tokens) fails the audit; anything else raised (a bug, the database) gives the
    claim back and raises, and the sweep queues the job again, up to SAPO_AUDIT_JOB_ATTEMPTS starts:
    the last one's failure closes the audit errored."""
    audit = audit_claim(audit_id)
    if audit is None:
        return f"audit {audit_id}: not waiting for a job (decided, or claimed by another)"
    try:
        return _replay_and_decide(audit)
    except Exception as exc:
        _job_raised(audit, exc)
        raise


def _job_raised(audit: Audit, exc: Exception) -> None:
    """Give the claim back (queued_at NULL: the sweep's next pass queues it), or close the audit errored
    on its last attempt. A failure here (the database down) leaves the claim to its lease."""
    try:
        if audit.attempts >= settings.SAPO_AUDIT_JOB_ATTEMPTS:
            reason = RAISED_REASON.format(error=type(exc).__name__, attempts=audit.attempts)
            audit_error(audit_id=audit.id, reason=reason)
        else:
            Audit.objects.filter(id=audit.id, state=AuditState.UPLOADED, started_at=audit.started_at).update(
                started_at=None, queued_at=None
            )
    except Exception:  # noqa: BLE001 - the job's own exception is the one to raise
        log.exception("audit %s: could not record its job's failure", audit.id)


def _replay_and_decide(audit: Audit) -> str:
    from audits import replay

    started = time.process_time()
    import torch

    torch.set_num_threads(1)  # one core per worker: the worker count is the audits' CPU bound
    groups = _groups_to_replay(audit)
    try:
        cache_dir = Path(settings.SAPO_AUDIT_MODEL_CACHE)
        tensors = replay.load_checkpoint(
            Path(audit.upload_path),
            sha256=audit.upload_sha256,
            weights=audit.weights,
            model=audit.model,
            cache_dir=cache_dir,
            max_bytes=settings.SAPO_AUDIT_MAX_CHECKPOINT_BYTES,
        )
        tolerances = replay.tolerances_for(tensors)
        model, tokenizer = replay.load_model(audit.model, tensors, cache_dir=cache_dir)
        del tensors
        if (base := replay.base_digest(audit.model)) is not None:
            audit_base_record(model=audit.model, digest=base)
        report = replay.replay_groups(
            model, tokenizer, groups, max_tokens=settings.SAPO_AUDIT_MAX_TOKENS, tolerances=tolerances
        )
    except replay.AuditFailed as failed:
        cpu = time.process_time() - started
        audit_fail(audit_id=audit.id, reason=str(failed), cpu_seconds=cpu)
        return f"audit {audit.id}: failed ({failed})"
    cpu = time.process_time() - started
    if report.groups == 0:
        audit_fail(audit_id=audit.id, reason="none of the audited groups' texts is stored any more", cpu_seconds=cpu)
        return f"audit {audit.id}: failed (no group to replay)"
    audit_pass(audit_id=audit.id, cpu_seconds=cpu, groups=report.groups, tokens=report.tokens)
    return f"audit {audit.id}: passed ({report.groups} groups, {report.tokens} tokens, {cpu:.1f} CPU-s)"


def _groups_to_replay(audit: Audit) -> list:
    """Up to SAPO_AUDIT_GROUPS of the audit's groups whose texts and proof are stored, chosen with
    the operating system's randomness."""
    import secrets

    from audits.replay import GroupToReplay

    ids = list(AuditGroup.objects.filter(audit=audit).values_list("rollout_id", flat=True))
    rows = [
        r
        for r in Rollout.objects.filter(id__in=ids).with_texts().annotate(proof=F("_texts__proof"))
        if r.completions is not None and r.proof
    ]
    chosen = secrets.SystemRandom().sample(rows, min(len(rows), settings.SAPO_AUDIT_GROUPS))
    return [
        GroupToReplay(str(r.id), r.dataset, r.seed, r.index, r.question, list(r.completions), dict(r.proof))
        for r in chosen
    ]


def audit_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Expire the requested audits past their deadline; queue again the uploaded ones whose job was
    lost (queued or started longer than the lease ago, attempts left); close errored the ones out of
    attempts; delete errored audits' uploads past their retention."""
    now = now or timezone.now()
    expired = 0
    for audit_id in Audit.objects.filter(state=AuditState.REQUESTED, deadline__lte=now).values_list("id", flat=True):
        if audit_fail(audit_id=audit_id, reason=EXPIRED_REASON, state=AuditState.EXPIRED, now=now):
            expired += 1
    lease = now - timedelta(seconds=settings.SAPO_AUDIT_JOB_LEASE_SECONDS)
    lost = Audit.objects.filter(state=AuditState.UPLOADED, attempts__lt=settings.SAPO_AUDIT_JOB_ATTEMPTS).filter(
        Q(queued_at=None) | Q(started_at=None, queued_at__lt=lease) | Q(started_at__lt=lease)
    )
    requeued = 0
    for audit_id in lost.values_list("id", flat=True):
        audit_enqueue(audit_id)
        requeued += 1
    # Out of attempts, the last job lost too (a job that raised closed its audit itself).
    spent = Audit.objects.filter(state=AuditState.UPLOADED, attempts__gte=settings.SAPO_AUDIT_JOB_ATTEMPTS).filter(
        Q(started_at=None) | Q(started_at__lt=lease)
    )
    errored = 0
    for audit_id, attempts in spent.values_list("id", "attempts"):
        if audit_error(audit_id=audit_id, reason=LOST_REASON.format(attempts=attempts), now=now):
            errored += 1
    uploads_deleted = errored_uploads_expire(now=now)
    return {"expired": expired, "requeued": requeued, "errored": errored, "uploads_deleted": uploads_deleted}


def audit_sweep_job() -> str:
    """The scheduled sweep (ops.scheduled)."""
    done = audit_sweep()
    return (
        f"{done['expired']} expired, {done['requeued']} queued again, {done['errored']} errored,"
        f" {done['uploads_deleted']} errored uploads deleted"
    )


def audits_waiting(*, now: datetime | None = None) -> list[uuid.UUID]:
    """Uploaded audits no job holds (the worker's own queue without Redis), oldest first."""
    now = now or timezone.now()
    lease = now - timedelta(seconds=settings.SAPO_AUDIT_JOB_LEASE_SECONDS)
    return list(
        Audit.objects.filter(state=AuditState.UPLOADED, attempts__lt=settings.SAPO_AUDIT_JOB_ATTEMPTS)
        .filter(Q(started_at=None) | Q(started_at__lt=lease))
        .order_by("uploaded_at")
        .values_list("id", flat=True)
    )
