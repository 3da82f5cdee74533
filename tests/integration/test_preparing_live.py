"""A node whose model is still downloading is online and shown preparing: `sapo-node run` in a process of
its own against daphne (PostgreSQL, Redis), with an empty model cache and the site's prebuilt tiny-mini
coming through a proxy at 100 kB/s. The node says hello before its model is ready; its status says it
downloads, how far and its ETA; /me/ shows it; Ctrl-C then stops it with a line that says so."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings
from factories import make_node_with_token
from support.live_nodes import wait_for

from nodes.models import Node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-mini"
QUICK = {"SAPO_PRESENCE_HEARTBEAT_SECONDS": 2}


@pytest.fixture
def published(tiny_cache_dir: Path, tmp_path: Path) -> Path:
    """tiny-mini published by the site's own service (copied from the test cache's build)."""
    from prebuilt import services

    folder = tmp_path / "published"
    with override_settings(SAPO_PREBUILT_DIR=str(folder)):
        services.models_publish(names=[MODEL], from_cache=tiny_cache_dir, progress=False)
    return folder


def test_a_node_downloading_its_model_is_shown_preparing_and_ctrl_c_says_so(
    swarm_servers, proxies, published, tmp_path, client
):
    node, token = make_node_with_token(name="preparing")
    client.force_login(node.owner)
    cache = tmp_path / "cache"
    with swarm_servers(settings=QUICK | {"SAPO_PREBUILT_DIR": str(published)}) as server:
        proxy = proxies(server.port)
        proxy.pace("down", 100_000)  # the model's 3.7 MB in about 37 s
        env = {
            **os.environ,
            "SAPO_CACHE": str(cache),
            "SAPO_TOKEN": token,
            "PYTHONPATH": os.pathsep.join([str(REPO / "node_client"), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, "-m", "sapo_node", "run", "--server", f"http://127.0.0.1:{proxy.port}"]
        command += ["--model", MODEL, "--out", str(tmp_path / "run"), "--threads", "1", "--rounds", "2"]
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:

            def downloading() -> bool:
                assert proc.poll() is None, proc.stdout.read()[-3000:]
                said = Node.objects.get(id=node.id)
                return said.reported_state == "preparing" and said.reported_preparing == "download"

            assert wait_for(downloading, timeout=150)
            said = Node.objects.get(id=node.id)
            assert said.reported_progress is not None and 0 <= said.reported_progress < 1
            assert said.reported_eta_seconds is not None and said.reported_eta_seconds > 0
            assert not any(cache.glob(f"{MODEL}-*/model.safetensors"))  # the model is not ready yet

            body = client.get("/me/").content.decode()
            card = re.search(rf'<article class="card node-card" id="node-{node.id}".*?</article>', body, re.S)
            assert card, body[:2000]
            assert "badge badge-online" in card.group(0), card.group(0)[:1500]
            state = re.search(r"<dd data-state>(.*?)</dd>", card.group(0), re.S).group(1)
            assert state.startswith("preparing") and "downloading its model" in state, state
            assert re.search(r"\d+%, about [\d.]+ (s|min|h) left", state), state

            proc.send_signal(signal.SIGINT)
            output, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, output[-3000:]
    assert f"stopped while preparing {MODEL}; the same command prepares it again" in output, output[-3000:]
    assert not any(cache.glob(f"{MODEL}-*/model.safetensors"))  # nothing half-written taken for a model
