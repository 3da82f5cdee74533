"""A checkpoint uploaded as its difference from the model's base (sapo_node.weightdiff), through the real
upload endpoint and the audit job (real PostgreSQL; the job in this process, as test_audit_worker runs
it): the node's store makes the difference of an honest node's updated tiny-mini weights and it passes
its audit; a difference from a base the site does not hold is refused at the upload (and the whole
file then passes); a corrupted difference and one that inflates past its tensors fail the audit; a
difference whose weights would pass the size bound is refused before it is queued."""

from __future__ import annotations

import copy
import io
import json
import struct
import time
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save
from support.audits import honest_groups, make_audit, upload

from audits import jobs
from audits.models import Audit, AuditBase
from pool.models import Rollout
from sapo_node import weightdiff
from sapo_node.commitments import CommitmentStore, base_tensors, model_tensors, tensors_digest

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(600)]


@pytest.fixture
def site(settings, tmp_path, tiny_cache_dir):
    """The site's upload folder and model copies; the queue is PostgreSQL's (the job runs here)."""
    settings.REDIS_URL = ""
    settings.SAPO_AUDIT_UPLOAD_DIR = tmp_path / "uploads"
    settings.SAPO_AUDIT_MODEL_CACHE = tiny_cache_dir
    return settings


@pytest.fixture
def updated(tiny_mini_policy):
    """An honest node's tiny-mini after an update: every weight moved by about 1e-5, as a few GRPO steps
    at lr 1e-5 move them (bench/audit_diff.py measures the node's own update)."""
    model, tokenizer = tiny_mini_policy
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 1e-5)
    return model, tokenizer


@pytest.fixture
def base(tiny_cache_dir):
    """The site's tiny-mini base, recorded as a worker records it once it has built the model."""
    digest, tensors = base_tensors("tiny-mini", cache_dir=tiny_cache_dir)
    AuditBase.objects.get_or_create(model="tiny-mini", digest=digest)
    return digest, tensors


def node_diff(tmp_path: Path, model, audit: Audit, cache: Path) -> bytes:
    """What the node's store uploads for the audit: its committed weights as a difference."""
    store = CommitmentStore(tmp_path / "node", base="tiny-mini", base_cache=cache)
    commitment = store.commit(model)
    assert store.hold(str(audit.id), commitment.digest, time.time() + 3600)
    path = store.diff(str(audit.id), commitment.digest)
    assert path is not None and weightdiff.is_diff(path)
    return path.read_bytes()


def inside_the_largest_stream(data: bytes) -> int:
    """The offset of a byte a quarter into the file's largest zlib stream: in its low byte plane, whose
    bytes are noise stored as literals, so a flipped bit changes the weights. (Near a stream's end lie
    the high planes' runs of zeros, where a flipped bit may turn one copy of zeros into another, and
    the file reconstructs the same weights.)"""
    header = weightdiff.read_header(io.BytesIO(data), file_size=len(data))
    tensors = header.tensors
    i = max(range(len(tensors)), key=lambda k: tensors[k].stored)
    before = sum(t.stored for t in tensors[:i])  # the streams lie in the header's order
    return header.data_offset + before + tensors[i].stored // 4


def audited(node, model, tokenizer) -> tuple[Audit, list[Rollout], str]:
    digest = tensors_digest(model_tensors(model))
    groups = honest_groups(model, tokenizer, node, digest)
    return make_audit(node, groups, weights=digest), groups, digest


def test_an_honest_difference_passes_its_audit(client, node, node_token, updated, base, site, tmp_path, tiny_cache_dir):
    model, tokenizer = updated
    audit, groups, _ = audited(node, model, tokenizer)
    data = node_diff(tmp_path, model, audit, tiny_cache_dir)
    whole = save(model_tensors(model))
    assert len(data) < 0.75 * len(whole)
    assert upload(client, node_token, audit, data)["state"] == "uploaded"
    audit.refresh_from_db()
    assert audit.upload_path.endswith(".sapodiff")
    jobs.audit_run(audit.id)
    audit.refresh_from_db()
    assert (audit.state, audit.reason) == ("passed", "")
    assert {Rollout.objects.get(id=g.id).audit_state for g in groups} == {"audited"}
    assert not Path(audit.upload_path).exists()


def test_a_difference_from_another_base_is_refused_and_the_whole_file_passes(
    client, node, node_token, updated, base, site
):
    model, tokenizer = updated
    audit, _, digest = audited(node, model, tokenizer)
    other = {k: v + 1e-3 for k, v in base[1].items()}  # a base this site never built
    path = Path(site.SAPO_AUDIT_UPLOAD_DIR).parent / "other.sapodiff"
    weightdiff.write_diff(
        path, model_tensors(model), other, model="tiny-mini", base_digest=tensors_digest(other), weights=digest
    )
    answer = upload(client, node_token, audit, path.read_bytes(), status=422)
    assert answer["code"] == "unknown_base"
    audit.refresh_from_db()
    assert (audit.state, audit.upload_size) == ("requested", 0)
    assert list(Path(site.SAPO_AUDIT_UPLOAD_DIR).iterdir()) == []
    # The node's answer to unknown_base: the whole checkpoint, which still passes.
    assert upload(client, node_token, audit, save(model_tensors(model)))["state"] == "uploaded"
    jobs.audit_run(audit.id)
    audit.refresh_from_db()
    assert (audit.state, audit.reason) == ("passed", "")


def test_a_corrupted_difference_fails_the_audit(
    client, node, node_token, updated, base, site, tmp_path, tiny_cache_dir
):
    model, tokenizer = updated
    audit, groups, _ = audited(node, model, tokenizer)
    data = bytearray(node_diff(tmp_path, model, audit, tiny_cache_dir))
    data[inside_the_largest_stream(bytes(data))] ^= 0x10  # the upload's sha256 is of these bytes
    upload(client, node_token, audit, bytes(data))
    jobs.audit_run(audit.id)
    audit.refresh_from_db()
    assert audit.state == "failed"
    assert "difference is refused" in audit.reason or "weights_digest is not the digest" in audit.reason
    assert {Rollout.objects.get(id=g.id).audit_state for g in groups} == {"failed"}


def bomb(base: dict, digest: str, weights: str) -> bytes:
    """A well-formed header over the base's tensors whose first stream inflates to 64 times its tensor."""
    names = sorted(base)
    streams, entries = [], []
    for i, name in enumerate(names):
        t = base[name]
        raw = t.numel() * t.element_size()
        stream = zlib.compress(bytes(raw * (64 if i == 0 else 1)), 9)
        streams.append(stream)
        entries.append({"name": name, "dtype": "float32", "shape": list(t.shape), "stored": len(stream)})
    header = json.dumps(
        {
            "format": 1,
            "codec": "zlib",
            "transform": weightdiff.TRANSFORM,
            "model": "tiny-mini",
            "base": digest,
            "weights": weights,
            "tensors": entries,
        }
    ).encode()
    return weightdiff.MAGIC + struct.pack("<I", len(header)) + header + b"".join(streams)


def test_a_difference_that_inflates_past_its_tensors_fails_and_one_past_the_bound_is_refused(
    client, node, node_token, updated, base, site
):
    model, tokenizer = updated
    audit, _, digest = audited(node, model, tokenizer)
    data = bomb(base[1], base[0], digest)
    assert upload(client, node_token, audit, data)["state"] == "uploaded"
    jobs.audit_run(audit.id)
    audit.refresh_from_db()
    assert audit.state == "failed" and "inflates past" in audit.reason

    site.SAPO_AUDIT_MAX_CHECKPOINT_BYTES = 2 * len(data)  # the file fits; its weights (4.2 MB) do not
    second = make_audit(node, weights="ef" * 32)
    answer = upload(client, node_token, second, data, status=413)
    assert answer["code"] == "checkpoint_too_large"
    assert Audit.objects.get(id=second.id).state == "requested"


def test_a_worker_records_the_base_it_builds(client, node, node_token, updated, site):
    """A full upload's job records the site's base, after which differences from it are taken."""
    model, tokenizer = updated
    audit, _, _ = audited(node, model, tokenizer)
    assert upload(client, node_token, audit, save(model_tensors(model)))["state"] == "uploaded"
    jobs.audit_run(audit.id)
    digest, _ = base_tensors("tiny-mini", cache_dir=site.SAPO_AUDIT_MODEL_CACHE)
    assert AuditBase.objects.filter(model="tiny-mini", digest=digest).exists()


def test_staff_see_the_recorded_bases_in_the_admin(admin_client, base):
    page = admin_client.get("/admin/audits/auditbase/")
    assert page.status_code == 200 and base[0] in page.content.decode()
    assert admin_client.get("/admin/audits/auditbase/add/").status_code == 403
