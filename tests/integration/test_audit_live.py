"""An audit end to end, every part real: a node (`sapo-node run`, the built-in tiny-mini model) shares
groups under the server's challenges over a live socket (daphne, PostgreSQL), is asked in its ack to
upload the weights its first groups committed to, uploads them through the checkpoint endpoint, and
the audit worker (`manage.py sapo_audit_worker`, a separate process) replays them: the audit passes
and the node's groups with a proof become audited. On a site whose worker has built tiny-mini's base
the node uploads its weights as a difference from it; on one whose worker has not, the site answers
the difference `unknown_base`, the node sends the whole file, and the worker records the base."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from factories import make_node_with_token
from support.live_nodes import wait_for

from audits.models import Audit, AuditBase
from pool.models import Rollout
from sapo_node.cli import main
from sapo_node.commitments import base_tensors

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("base_known", [False, True], ids=["whole-file", "difference"])
def test_an_honest_node_passes_its_first_audit_over_a_real_socket(
    swarm_servers, tiny_cache_dir, tmp_path, monkeypatch, base_known
):
    uploads = tmp_path / "uploads"
    # Its first digest is always drawn; a later one is drawn at the rate, boosted for a node this young
    # (0.05 x 4 for tiny-mini): none here, so the one audit below is the first digest's.
    settings = {"SAPO_AUDIT_UPLOAD_DIR": uploads, "SAPO_AUDIT_MODEL_CACHE": tiny_cache_dir, "SAPO_AUDIT_RATE": 0.0}
    node, token = make_node_with_token(name="honest")
    db = connection.settings_dict
    worker_env = {
        **os.environ,
        "DATABASE_URL": f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "REDIS_URL": "",  # the worker takes uploaded audits from PostgreSQL, as under `make run`
        "SAPO_AUDIT_UPLOAD_DIR": str(uploads),
        "SAPO_AUDIT_MODEL_CACHE": str(tiny_cache_dir),
        "OMP_NUM_THREADS": "1",
    }
    base, _ = base_tensors("tiny-mini", cache_dir=tiny_cache_dir)
    if base_known:
        AuditBase.objects.create(model="tiny-mini", digest=base)
    monkeypatch.setenv("SAPO_TOKEN", token)
    monkeypatch.setenv("SAPO_CACHE", str(tiny_cache_dir))  # the node's built-in model, built once per test run
    with swarm_servers(settings=settings) as server:
        argv = ["run", "--server", server.ws_url + "/ws/node/", "--model", "tiny-mini", "--out", str(tmp_path / "run")]
        argv += ["--questions", "2", "--generations", "4", "--max-new-tokens", "16", "--rounds", "2", "--seed", "3"]
        argv += ["--checkpoint-every", "0", "--connect-wait", "10", "--flush-wait", "60"]
        assert main(argv) == 0
        audit = Audit.objects.get(node=node)  # the node's first weights: always audited
        assert audit.state == "uploaded" and audit.model == "tiny-mini"
        assert Path(audit.upload_path).suffix == (".sapodiff" if base_known else ".safetensors")
        worker = subprocess.run(
            [sys.executable, "manage.py", "sapo_audit_worker", "--burst"],
            cwd=REPO,
            env=worker_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
    audit.refresh_from_db()
    assert (audit.state, audit.reason) == ("passed", ""), worker.stdout + worker.stderr
    assert audit.groups_replayed > 0 and audit.cpu_seconds > 0
    assert AuditBase.objects.filter(model="tiny-mini", digest=base).exists()
    proved = Rollout.objects.filter(node=node).exclude(proof_weights=None)
    assert proved.filter(proof_weights=audit.weights).exists()
    assert wait_for(
        lambda: set(proved.filter(proof_weights=audit.weights).values_list("audit_state", flat=True)) == {"audited"}
    )
    assert not list(uploads.iterdir())
