"""The checkpoint upload (audits.upload over Django's test client, real PostgreSQL): a node's token, its
own audit only, chunks in order inside their bounds, the file's sha256 checked before it is queued."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from factories import make_node_with_token
from support.audits import make_audit

from audits.models import Audit, AuditState
from audits.upload import MAX_CHUNK_BYTES

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def upload_dir(settings, tmp_path) -> Path:
    settings.SAPO_AUDIT_UPLOAD_DIR = tmp_path / "audits"
    settings.REDIS_URL = ""  # the queue is PostgreSQL's here: the job itself is tested in test_audit_worker
    return settings.SAPO_AUDIT_UPLOAD_DIR


@pytest.fixture
def holder(node, node_token):
    return node, node_token, make_audit(node)


def put(
    client,
    audit_id,
    body: bytes,
    *,
    token: str | None,
    first: int = 0,
    total: int | None = None,
    sha: str | None = None,
    **headers,
):
    total = len(body) if total is None else total
    extra = {"HTTP_CONTENT_RANGE": f"bytes {first}-{first + len(body) - 1}/{total}"}
    if token is not None:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    if sha is not None:
        extra["HTTP_X_CHECKPOINT_SHA256"] = sha
    extra.update(headers)
    return client.put(
        f"/api/v1/audits/{audit_id}/checkpoint", data=body, content_type="application/octet-stream", **extra
    )


def test_chunks_in_order_make_the_file_and_queue_the_audit(
    client, holder, upload_dir, django_capture_on_commit_callbacks
):
    node, token, audit = holder
    data = os.urandom(3000)
    sha = hashlib.sha256(data).hexdigest()
    first = put(client, audit.id, data[:1000], token=token, total=3000)
    assert first.status_code == 200, first.json()
    assert first.json() == {"state": "requested", "received": 1000, "total": 3000}
    assert put(client, audit.id, data[1000:2000], token=token, first=1000, total=3000).json()["received"] == 2000
    with django_capture_on_commit_callbacks(execute=True):
        last = put(client, audit.id, data[2000:], token=token, first=2000, total=3000, sha=sha)
    assert last.status_code == 200, last.json()
    assert last.json()["state"] == "uploaded"
    audit.refresh_from_db()
    assert (audit.state, audit.upload_sha256, audit.upload_size) == (AuditState.UPLOADED, sha, 3000)
    assert audit.queued_at is not None
    path = Path(audit.upload_path)
    assert path.parent == upload_dir and path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(upload_dir.stat().st_mode) == 0o700
    again = put(client, audit.id, data[:10], token=token, total=3000)
    assert (again.status_code, again.json()["code"]) == (409, "audit_closed")


def test_a_wrong_sha256_discards_the_file_and_the_node_starts_again(client, holder, upload_dir):
    _, token, audit = holder
    data = os.urandom(500)
    bad = put(client, audit.id, data, token=token, sha="0" * 64)
    assert (bad.status_code, bad.json()["code"]) == (422, "hash_mismatch")
    audit.refresh_from_db()
    assert (audit.state, audit.upload_size) == (AuditState.REQUESTED, 0)
    assert list(upload_dir.iterdir()) == []
    good = put(client, audit.id, data, token=token, sha=hashlib.sha256(data).hexdigest())
    assert good.json()["state"] == "uploaded"


def test_out_of_order_chunks_are_refused_with_where_to_resume(client, holder):
    _, token, audit = holder
    put(client, audit.id, b"a" * 100, token=token, total=300)
    skipped = put(client, audit.id, b"c" * 100, token=token, first=200, total=300, sha="0" * 64)
    assert (skipped.status_code, skipped.json()["code"], skipped.json()["received"]) == (409, "out_of_order", 100)
    other_total = put(client, audit.id, b"b" * 100, token=token, first=100, total=400)
    assert (other_total.status_code, other_total.json()["code"]) == (409, "bad_range")
    # A resent chunk from 0 restarts the upload (a node that lost its place).
    assert put(client, audit.id, b"z" * 100, token=token, first=0, total=300).status_code == 409
    assert Audit.objects.get(id=audit.id).upload_size == 100


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"HTTP_CONTENT_RANGE": "bytes 0-9"}, 400, "bad_range"),
        ({"HTTP_CONTENT_RANGE": "bytes 5-2/10"}, 400, "bad_range"),
        ({"HTTP_CONTENT_RANGE": "bytes 0-9/5"}, 400, "bad_range"),
        ({"HTTP_CONTENT_RANGE": f"bytes 0-9/{(1 << 30) + 1}"}, 413, "checkpoint_too_large"),
        ({"HTTP_CONTENT_RANGE": f"bytes 0-{MAX_CHUNK_BYTES}/{1 << 30}"}, 413, "chunk_too_large"),
        ({"HTTP_CONTENT_RANGE": "bytes 0-19/30"}, 400, "bad_length"),  # says 20 bytes, sends 10
        ({"HTTP_CONTENT_RANGE": "bytes 0-9/10"}, 400, "missing_sha256"),  # the last chunk names no hash
    ],
)
def test_bad_ranges_and_sizes_are_refused_with_their_code(client, holder, headers, status, code):
    _, token, audit = holder
    answer = put(client, audit.id, b"x" * 10, token=token, **headers)
    assert (answer.status_code, answer.json()["code"]) == (status, code)
    assert Audit.objects.get(id=audit.id).upload_size == 0


def test_only_the_audits_node_with_a_valid_token_may_upload(client, holder, user):
    node, token, audit = holder
    assert put(client, audit.id, b"x", token=None, total=10).json()["code"] == "unauthenticated"
    assert put(client, audit.id, b"x", token="sapo_" + "x" * 43, total=10).status_code == 401
    _, other_token = make_node_with_token(owner=user, name="other")
    stranger = put(client, audit.id, b"x", token=other_token, total=10)
    assert (stranger.status_code, stranger.json()["code"]) == (404, "not_found")
    assert put(client, "not-a-uuid", b"x", token=token, total=10).status_code == 404
    node.banned_at = node.created_at
    node.save(update_fields=["banned_at"])
    assert put(client, audit.id, b"x", token=token, total=10).status_code == 401
    assert client.get(f"/api/v1/audits/{audit.id}/checkpoint").status_code == 405


def test_past_its_deadline_an_audit_takes_no_upload(client, node, node_token):
    audit = make_audit(node, deadline_in=-1)
    answer = put(client, audit.id, b"x", token=node_token, total=10)
    assert (answer.status_code, answer.json()["code"]) == (410, "deadline_passed")


def test_chunks_per_node_are_rate_limited(client, holder, settings):
    _, token, audit = holder
    settings.SAPO_AUDIT_CHUNKS_PER_MINUTE = 3
    from accounts import limits

    limits.clear("audit-chunk", str(audit.node_id))
    codes = [put(client, audit.id, b"x" * 10, token=token, first=10 * i, total=1000).status_code for i in range(4)]
    assert codes == [200, 200, 200, 429]
    limits.clear("audit-chunk", str(audit.node_id))
