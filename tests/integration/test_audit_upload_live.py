"""The node's checkpoint upload (sapo_node.transport.upload) against the platform's own endpoint on a
live server (daphne, PostgreSQL): the committed file arrives whole and its audit is uploaded; an
upload the server already holds part of goes on from where the server stands; another node's audit
is refused and not retried."""

from __future__ import annotations

import hashlib
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from factories import make_node_with_token
from support.audits import make_audit
from support.live_nodes import wait_for

from audits.models import Audit, AuditState
from sapo_node.commitments import CommitmentStore
from sapo_node.transport.upload import CheckpointUploader, parse_audits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CHUNK = 2048


@pytest.fixture
def server(asgi_server, tmp_path):
    with asgi_server(settings={"SAPO_AUDIT_UPLOAD_DIR": tmp_path / "uploads", "REDIS_URL": ""}) as live:
        yield live


@pytest.fixture
def committed(tmp_path):
    store = CommitmentStore(tmp_path / "commitments")
    return store, store.commit(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)))


def entry(audit: Audit) -> dict:
    return {
        "id": str(audit.id),
        "weights": audit.weights,
        "upload": f"/api/v1/audits/{audit.id}/checkpoint",
        "deadline": int(audit.deadline.timestamp()),
    }


def test_the_committed_file_reaches_the_platform_whole_and_the_audit_is_uploaded(server, committed, tmp_path):
    store, c = committed
    node, token = make_node_with_token()
    audit = make_audit(node, weights=c.digest)
    uploader = CheckpointUploader(server.url, token, store, chunk_bytes=CHUNK)
    try:
        uploader.request(parse_audits([entry(audit)]))
        assert wait_for(lambda: uploader.uploaded == [str(audit.id)])
    finally:
        uploader.close()
    audit.refresh_from_db()
    data = c.path.read_bytes()
    assert len(data) > 3 * CHUNK and audit.state == AuditState.UPLOADED
    assert audit.upload_sha256 == hashlib.sha256(data).hexdigest()
    assert Path(audit.upload_path).read_bytes() == data
    assert store.holds() == {} and store.prune(keep=set()) == [c.digest]  # the node lets it go


def test_an_upload_the_server_holds_part_of_goes_on_from_there(server, committed):
    store, c = committed
    node, token = make_node_with_token()
    audit = make_audit(node, weights=c.digest)
    data = c.path.read_bytes()
    first = urllib.request.Request(
        server.url + entry(audit)["upload"],
        data=data[:CHUNK],
        method="PUT",
        headers={"Authorization": f"Bearer {token}", "Content-Range": f"bytes 0-{CHUNK - 1}/{len(data)}"},
    )
    urllib.request.urlopen(first, timeout=20).read()  # an earlier run's first chunk

    uploader = CheckpointUploader(server.url, token, store, chunk_bytes=CHUNK, retry_min=0.05)
    try:
        uploader.request(parse_audits([entry(audit)]))
        assert wait_for(lambda: uploader.uploaded == [str(audit.id)])
    finally:
        uploader.close()
    audit.refresh_from_db()
    assert audit.state == AuditState.UPLOADED and Path(audit.upload_path).read_bytes() == data


def test_another_nodes_audit_is_refused_and_not_retried(server, committed):
    store, c = committed
    owner, _ = make_node_with_token()
    _, token = make_node_with_token()
    audit = make_audit(owner, weights=c.digest)
    uploader = CheckpointUploader(server.url, token, store, retry_min=0.05)
    try:
        uploader.request(parse_audits([entry(audit)]))
        assert wait_for(lambda: uploader.given_up == [str(audit.id)])
        time.sleep(0.3)
    finally:
        uploader.close()
    audit.refresh_from_db()
    assert audit.state == AuditState.REQUESTED and audit.upload_size == 0 and store.holds() == {}
