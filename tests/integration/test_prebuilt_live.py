"""A node takes the site's prebuilt model over real HTTP (daphne serving /models/, sapo_node.prebuilt
downloading): checked and bitwise the published files; a file whose sha256 or size is not the
manifest's, a connection cut mid-file, Ctrl-C or a kill mid-download keep nothing a later load could
take for a model; a site without a usable copy makes the node build its own, saying why."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.test import override_settings

from sapo_node.prebuilt import fetcher
from sapo_node.tiny.cache import build_info, load_tiny, tiny_path

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-mini"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(folder: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def pristine(tiny_cache_dir: Path, tmp_path_factory) -> Path:
    """tiny-mini published by the site's own service (copied from the test cache's build)."""
    from prebuilt import services

    folder = tmp_path_factory.mktemp("published")
    with override_settings(SAPO_PREBUILT_DIR=str(folder)):
        services.models_publish(names=[MODEL], from_cache=tiny_cache_dir, progress=False)
    return folder


@pytest.fixture(scope="module")
def site(asgi_server, tmp_path_factory):
    folder = tmp_path_factory.mktemp("site-models")
    with asgi_server(settings={"SAPO_PREBUILT_DIR": str(folder)}) as server:
        yield server, folder


@pytest.fixture
def served(site, pristine):
    """The live site, its prebuilt folder reset to the published tiny-mini."""
    server, folder = site
    shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    return server, folder


def test_a_node_takes_the_sites_model_checked_with_progress_lines(served, tmp_path):
    server, folder = served
    cache, out = tmp_path / "cache", io.StringIO()
    model, tokenizer = load_tiny(MODEL, cache_dir=cache, progress=False, fetch=fetcher(server.ws_url, MODEL, out=out))
    path = tiny_path(MODEL, cache)
    assert _tree(path) == _tree(tiny_path(MODEL, folder))  # every file, bitwise the site's
    assert sorted(p.name for p in cache.iterdir()) == [path.name, f"{path.name}.lock"]  # nothing else kept
    assert model.config.hidden_size == 128 and tokenizer.pad_token == "<|pad|>"
    lines = out.getvalue().splitlines()  # piped output: plain lines, the first and the last
    assert lines[0] == f"downloading {MODEL}: 0/3.7 MB (0 s)", lines
    assert lines[-1].startswith(f"downloading {MODEL}: 3.7/3.7 MB ("), lines
    # Loaded again: from the cache, no request (a site that is gone changes nothing).
    again = io.StringIO()
    load_tiny(MODEL, cache_dir=cache, progress=False, fetch=fetcher("ws://127.0.0.1:9", MODEL, out=again))
    assert again.getvalue() == ""


def test_the_site_serves_listed_files_only_with_length_and_checksum(served):
    server, folder = served
    published = tiny_path(MODEL, folder)
    with urllib.request.urlopen(f"{server.url}/models/manifest.json") as response:
        assert response.headers["Content-Type"] == "application/json"
        assert "max-age=300" in response.headers["Cache-Control"]
    with urllib.request.urlopen(f"{server.url}/models/{published.name}/model.safetensors") as response:
        body = response.read()
        assert int(response.headers["Content-Length"]) == len(body) == (published / "model.safetensors").stat().st_size
        assert response.headers["ETag"] == f'"{hashlib.sha256(body).hexdigest()}"'
        assert "public" in response.headers["Cache-Control"]
    (folder / "secret.txt").write_text("not a model file")
    for path in (
        f"{published.name}.lock/x",
        f"{published.name}/..%2Fsecret.txt",
        f"{published.name}/not-listed.bin",
        "secret.txt/secret.txt",
    ):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/models/{path}")
        assert refused.value.code == 404, path
    (folder / "manifest.json").unlink()
    with pytest.raises(urllib.error.HTTPError) as none:
        urllib.request.urlopen(f"{server.url}/models/manifest.json")
    assert none.value.code == 404


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_file_that_is_not_the_manifests_is_refused_and_nothing_kept(served, tmp_path, damage):
    server, folder = served
    target = tiny_path(MODEL, folder) / "model.safetensors"
    data = bytearray(target.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-1000:]
    target.write_bytes(bytes(data))
    cache, out = tmp_path / "cache", io.StringIO()
    cache.mkdir()
    path = tiny_path(MODEL, cache)
    assert fetcher(server.url, MODEL, out=out)(path) is False
    why = "its sha256 is not the manifest's" if damage == "flipped byte" else "the site sends"
    assert f"model.safetensors: {why}" in out.getvalue() and "building it here" in out.getvalue(), out.getvalue()
    assert list(cache.iterdir()) == []


def test_a_download_cut_mid_file_keeps_nothing(served, tmp_path, proxies):
    server, _ = served
    proxy = proxies(server.port)
    # The connection that has carried 500 kB of a file is cut (the manifest's is far smaller).
    proxy.cut_when("down", lambda conn, chunk: 1000 if conn.down_bytes + len(chunk) > 500_000 else None)
    cache, out = tmp_path / "cache", io.StringIO()
    cache.mkdir()
    assert fetcher(f"http://127.0.0.1:{proxy.port}", MODEL, out=out)(tiny_path(MODEL, cache)) is False
    assert proxy.cuts == 1
    assert "model.safetensors: " in out.getvalue() and "building it here" in out.getvalue(), out.getvalue()
    assert list(cache.iterdir()) == []


_DOWNLOAD = """
import sys
from pathlib import Path
from sapo_node.prebuilt import fetcher
from sapo_node.tiny.cache import load_tiny
load_tiny("tiny-mini", cache_dir=Path(sys.argv[1]), progress=False, fetch=fetcher(sys.argv[2], "tiny-mini"))
"""


def _download_stopped(cache: Path, url: str, how: signal.Signals) -> None:
    """Start a download in a process of its own and send it `how` once part of the model file is written."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "node_client"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _DOWNLOAD, str(cache), url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size > 0 for p in cache.glob(".tiny-mini-*/model.safetensors")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-2000:]
            time.sleep(0.05)
        proc.send_signal(how)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_or_a_kill_mid_download_leaves_nothing_a_load_takes_for_a_model(served, tmp_path, proxies):
    server, folder = served
    proxy = proxies(server.port)
    proxy.pace("down", 200_000)  # 3.7 MB in about 18 s: stopped well before the end
    cache = tmp_path / "cache"
    cache.mkdir()
    path = tiny_path(MODEL, cache)

    _download_stopped(cache, f"http://127.0.0.1:{proxy.port}", signal.SIGINT)
    assert sorted(p.name for p in cache.iterdir()) == [f"{path.name}.lock"]  # the staging folder went with it

    _download_stopped(cache, f"http://127.0.0.1:{proxy.port}", signal.SIGKILL)
    left = [p.name for p in cache.iterdir() if p.name.startswith(".")]
    assert len(left) == 1 and build_info(path) is None  # a killed process cleans nothing up, but nothing is taken

    load_tiny(MODEL, cache_dir=cache, progress=False, fetch=fetcher(server.url, MODEL, out=io.StringIO()))
    assert sorted(p.name for p in cache.iterdir()) == [path.name, f"{path.name}.lock"]  # the leftover went
    assert _tree(path) == _tree(tiny_path(MODEL, folder))


def test_without_a_usable_copy_the_node_builds_its_own_and_says_why(served, tmp_path):
    server, folder = served
    cache, out = tmp_path / "cache", io.StringIO()
    # A client whose recipe differs (here: 2 warm-start steps) never takes the site's model.
    load_tiny(MODEL, cache_dir=cache, steps=2, progress=False, fetch=fetcher(server.url, MODEL, steps=2, out=out))
    assert "is of another recipe than this client's" in out.getvalue() and "building it here" in out.getvalue()
    assert build_info(tiny_path(MODEL, cache, steps=2))["recipe"]["variant"]["steps"] == 2
    # A site that publishes nothing: the same, with its reason.
    (folder / "manifest.json").unlink()
    out = io.StringIO()
    assert fetcher(server.url, MODEL, out=out)(tiny_path(MODEL, cache)) is False
    assert "serves no prebuilt models (404)" in out.getvalue(), out.getvalue()
