"""An audit whose job keeps failing (docs/audits.md, "The queue"): the real worker process, on RQ and
polling PostgreSQL, meets an upload the site lost (its file gone from the upload folder, the site's
fault): each failed start gives the claim back, and the last one closes the audit `errored`. The node
loses nothing: no hold, its groups stay pending, its weights are drawn again, its inbox is empty; staff
see the audit on /metrics."""

from __future__ import annotations

import hashlib
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from support.audits import audit_worker_env, make_audit, pending_group, run_audit_worker

from audits import jobs, selection
from audits.jobs import audit_rerun
from audits.models import Audit, AuditState
from audits.selectors import node_hold_get, owner_failed_audits
from audits.services import audit_error
from common.errors import ApplicationError
from pool.models import Rollout

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def worker_env(settings, tmp_path, redis_url) -> dict[str, str]:
    settings.REDIS_URL = redis_url
    settings.SAPO_REDIS_PREFIX = f"test-audit-errors-{uuid.uuid4().hex[:8]}"
    settings.SAPO_AUDIT_UPLOAD_DIR = tmp_path / "uploads"
    return audit_worker_env(SAPO_AUDIT_JOB_ATTEMPTS="2")


def lost_upload(node, folder: Path) -> tuple[Audit, Rollout]:
    """An audit whose checkpoint arrived whole (hash checked) and was then lost by the site."""
    group = pending_group(node)
    audit = make_audit(node, [group])
    data = b"weights the site no longer has"
    Audit.objects.filter(id=audit.id).update(
        state=AuditState.UPLOADED,
        upload_path=str(folder / f"{audit.id}.safetensors"),
        upload_size=len(data),
        upload_total=len(data),
        upload_sha256=hashlib.sha256(data).hexdigest(),
        uploaded_at=timezone.now(),
    )
    return audit, group


def assert_errored_and_the_node_unharmed(audit: Audit, group: Rollout, user, log: str) -> None:
    audit.refresh_from_db()
    assert audit.state == "errored", log
    assert audit.attempts == 2 and "could not replay it (FileNotFoundError, 2 attempts)" in audit.reason
    assert audit.finished_at is not None
    assert Rollout.objects.get(id=group.id).audit_state == "pending"
    assert node_hold_get(node_id=audit.node_id) is None and owner_failed_audits(owner=user) == []
    # Nothing is open for its weights now: the node's next groups under them are drawn again.
    later = pending_group(audit.node, index=500)
    asked = selection.groups_stored(inserted={later.id})
    assert [a["weights"] for a in asked[audit.node_id]] == [audit.weights]


def test_a_job_that_keeps_raising_on_rq_ends_errored_not_failed(node, user, worker_env, settings):
    audit, group = lost_upload(node, settings.SAPO_AUDIT_UPLOAD_DIR)
    jobs.audit_enqueue(audit.id)
    first = run_audit_worker(worker_env, timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    after_one = Audit.objects.get(id=audit.id)
    # Its claim given back at once (queued_at cleared): the worker's start-up sweep queues it again.
    assert (after_one.state, after_one.attempts, after_one.started_at, after_one.queued_at) == (
        "uploaded",
        1,
        None,
        None,
    )
    second = run_audit_worker(worker_env, timeout=240)
    assert second.returncode == 0, second.stdout + second.stderr
    assert_errored_and_the_node_unharmed(audit, group, user, second.stdout + second.stderr)


def test_the_polling_worker_survives_a_raising_job_and_ends_it_errored(node, user, worker_env, settings):
    settings.REDIS_URL = ""
    worker_env["REDIS_URL"] = ""
    audit, group = lost_upload(node, settings.SAPO_AUDIT_UPLOAD_DIR)
    done = run_audit_worker(worker_env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "its job failed" in done.stderr
    assert_errored_and_the_node_unharmed(audit, group, user, done.stdout + done.stderr)


def test_the_sweep_ends_errored_an_audit_whose_last_job_was_lost(node, user, settings):
    settings.REDIS_URL = ""
    settings.SAPO_AUDIT_JOB_ATTEMPTS = 1
    audit, group = lost_upload(node, Path("/nonexistent"))
    now = timezone.now()
    assert jobs.audit_claim(audit.id, now=now) is not None  # its worker then killed
    assert jobs.audit_sweep(now=now)["errored"] == 0  # within the lease: the job may still be running
    later = now + timedelta(seconds=settings.SAPO_AUDIT_JOB_LEASE_SECONDS + 1)
    assert jobs.audit_sweep(now=later) == {"expired": 0, "requeued": 0, "errored": 1, "uploads_deleted": 0}
    audit.refresh_from_db()
    assert audit.state == "errored" and "lost its audit job (1 attempts" in audit.reason
    assert Rollout.objects.get(id=group.id).audit_state == "pending" and node_hold_get(node_id=node.id) is None


def errored_with_upload(node, folder: Path, size: int, finished_at) -> Audit:
    """An errored audit whose upload the site kept: `size` bytes on disk."""
    folder.mkdir(parents=True, exist_ok=True)
    audit = make_audit(node, [pending_group(node)], weights=uuid.uuid4().hex * 2)
    path = folder / f"{audit.id}.safetensors"
    path.write_bytes(b"w" * size)
    Audit.objects.filter(id=audit.id).update(
        state=AuditState.ERRORED, upload_path=str(path), upload_size=size, finished_at=finished_at
    )
    return Audit.objects.get(id=audit.id)


def test_the_sweep_deletes_errored_uploads_past_their_days_or_their_bytes(node, settings, tmp_path):
    settings.REDIS_URL = ""
    settings.SAPO_AUDIT_ERRORED_KEEP_SECONDS = 7 * 86_400
    settings.SAPO_AUDIT_ERRORED_KEEP_BYTES = 250
    now = timezone.now()
    old = errored_with_upload(node, tmp_path, 10, now - timedelta(days=8))
    older_in_bytes = errored_with_upload(node, tmp_path, 100, now - timedelta(days=2))
    newer = [errored_with_upload(node, tmp_path, 100, now - timedelta(days=1, hours=h)) for h in (1, 0)]
    assert jobs.audit_sweep(now=now)["uploads_deleted"] == 2  # 8 days old; past 250 bytes with the newer two
    for audit, kept in ((old, False), (older_in_bytes, False), (newer[0], True), (newer[1], True)):
        audit.refresh_from_db()
        assert (bool(audit.upload_path), any(tmp_path.glob(f"{audit.id}*"))) == (kept, kept), audit
    assert jobs.audit_sweep(now=now)["uploads_deleted"] == 0
    with pytest.raises(ApplicationError) as gone:  # its upload deleted: the node uploads anew
        audit_rerun(audit_id=old.id)
    assert gone.value.code == "upload_gone"


def test_an_errored_audit_does_not_run_again_while_its_weights_have_an_open_audit(node, settings, tmp_path):
    settings.REDIS_URL = ""
    audit = errored_with_upload(node, tmp_path, 10, timezone.now())
    make_audit(node, [pending_group(node)], weights=audit.weights)  # drawn again since it errored
    with pytest.raises(ApplicationError) as refused:
        audit_rerun(audit_id=audit.id)
    assert refused.value.code == "audit_open"
    assert Audit.objects.get(id=audit.id).state == "errored"
    with pytest.raises(ApplicationError) as unknown:
        audit_rerun(audit_id=uuid.uuid4())
    assert unknown.value.code == "not_found"


def test_staff_run_errored_audits_again_from_the_admin(node, admin_client, settings, tmp_path):
    settings.REDIS_URL = ""  # the PostgreSQL poller takes it: no queue to look at
    audit = errored_with_upload(node, tmp_path, 10, timezone.now())
    passed = make_audit(node, [pending_group(node)], weights="ef" * 32, state=AuditState.PASSED)
    listing = admin_client.get("/admin/audits/audit/?state__exact=errored")
    assert listing.status_code == 200 and str(audit.id) in listing.content.decode()
    response = admin_client.post(
        "/admin/audits/audit/",
        {"action": "rerun", "_selected_action": [str(audit.id), str(passed.id)]},
        follow=True,
    )
    shown = [str(m) for m in response.context["messages"]]
    assert "1 audit(s) queued again." in shown and any(m.startswith("not_errored:") for m in shown), shown
    audit.refresh_from_db()
    assert (audit.state, audit.attempts) == ("uploaded", 0)
    assert jobs.audits_waiting() == [audit.id]


def gauges(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def test_staff_see_errored_audits_on_metrics(node, live_server):
    audit, _ = lost_upload(node, Path("/nonexistent"))
    before = gauges(live_server.url)
    assert (before["sapo_audits_uploaded"], before["sapo_audits_errored_last_day"]) == (1, 0)
    assert audit_error(audit_id=audit.id, reason=jobs.LOST_REASON.format(attempts=3)) is not None
    after = gauges(live_server.url)
    assert (after["sapo_audits_uploaded"], after["sapo_audits_errored_last_day"]) == (0, 1)
