"""A node takes the site's prebuilt model over real HTTP (daphne serving /models/, sapo_node.prebuilt
downloading): checked and bitwise the published files; a file whose sha256 or size is not the
manifest's keeps nothing; a connection cut mid-file, Ctrl-C or a kill mid-download keep only the part
of the file that came, which the next download resumes (a Range the site serves while the file's ETag
holds) and which a changed file on the site makes it drop; a site without a usable copy makes the node
build its own, saying why."""

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


def test_a_download_cut_mid_file_resumes_to_the_right_file(served, tmp_path, proxies):
    server, folder = served
    proxy = proxies(server.port)
    # The connection that has carried 500 kB of a file is cut (the manifest's is far smaller).
    proxy.cut_when("down", lambda conn, chunk: 1000 if conn.down_bytes + len(chunk) > 500_000 else None)
    cache, out = tmp_path / "cache", io.StringIO()
    cache.mkdir()
    path = tiny_path(MODEL, cache)
    assert fetcher(f"http://127.0.0.1:{proxy.port}", MODEL, out=out)(path) is True, out.getvalue()
    assert proxy.cuts == 1
    assert _tree(path) == _tree(tiny_path(MODEL, folder))
    # Resumed, not begun again: the files' bytes came through the proxy about once.
    size = sum(p.stat().st_size for p in path.iterdir())
    assert sum(c.down_bytes for c in proxy.history) < size + 200_000
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no part left


def test_a_part_of_a_file_the_site_has_changed_since_is_not_resumed(served, tmp_path, proxies):
    from prebuilt import services

    server, folder = served
    proxy = proxies(server.port)
    # Cut at 500 kB, and the proxy refuses the connections after: the download stops with a part kept.
    proxy.cut_when("down", lambda conn, chunk: 1000 if conn.down_bytes + len(chunk) > 500_000 else None, hold=True)
    cache, out = tmp_path / "cache", io.StringIO()
    cache.mkdir()
    path = tiny_path(MODEL, cache)
    assert fetcher(f"http://127.0.0.1:{proxy.port}", MODEL, out=out)(path) is False
    parts = list((cache / f".partial-{path.name}").iterdir())
    assert [p.name.split(".")[0] for p in parts] == ["model"] and 0 < parts[0].stat().st_size, parts
    # The site rebuilds the file (another sha256, another ETag) and publishes it again.
    target = tiny_path(MODEL, folder) / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01  # within the part the node holds: resuming it would give a wrong file
    target.write_bytes(bytes(data))
    with override_settings(SAPO_PREBUILT_DIR=str(folder)):
        services.manifest_write()
    assert fetcher(server.url, MODEL, out=io.StringIO())(path) is True
    assert _tree(path) == _tree(tiny_path(MODEL, folder))  # the new file, from byte 0
    assert sorted(p.name for p in cache.iterdir()) == [path.name]


def test_the_site_serves_a_range_while_the_etag_holds(served):
    server, folder = served
    published = tiny_path(MODEL, folder)
    body = (published / "model.safetensors").read_bytes()
    url, etag = f"{server.url}/models/{published.name}/model.safetensors", f'"{hashlib.sha256(body).hexdigest()}"'

    def get(**headers: str):
        try:
            response = urllib.request.urlopen(urllib.request.Request(url, headers=headers))
        except urllib.error.HTTPError as refused:
            return refused.code, dict(refused.headers), b""
        with response:
            return response.status, dict(response.headers), response.read()

    status, headers, part = get(Range="bytes=1000-", **{"If-Range": etag})
    assert status == 206 and part == body[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(body) - 1}/{len(body)}"
    assert headers["Content-Length"] == str(len(body) - 1000) and headers["ETag"] == etag
    status, headers, part = get(Range="bytes=10-19")
    assert status == 206 and part == body[10:20] and headers["Content-Range"] == f"bytes 10-19/{len(body)}"
    # Another ETag: the node's part is of another file, so the whole file comes.
    status, _, whole = get(Range="bytes=1000-", **{"If-Range": '"' + "0" * 64 + '"'})
    assert status == 200 and whole == body
    # A range past the end: 416, with the size.
    status, headers, _ = get(Range=f"bytes={len(body)}-")
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(body)}"
    # Forms served whole (several ranges, a suffix, nonsense).
    for form in ("bytes=0-1,5-9", "bytes=-100", "pages=1-2"):
        status, _, whole = get(Range=form)
        assert status == 200 and whole == body, form


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
        while not any(p.stat().st_size > 0 for p in cache.glob(".partial-tiny-mini-*/model.safetensors.*.part")):
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

    parts = cache / f".partial-{path.name}"
    _download_stopped(cache, f"http://127.0.0.1:{proxy.port}", signal.SIGINT)
    # The staging folder went with it; the part of the file kept for a resume is not a model.
    assert sorted(p.name for p in cache.iterdir()) == [parts.name, f"{path.name}.lock"]
    held = sum(p.stat().st_size for p in parts.iterdir())
    assert held > 0 and build_info(path) is None

    _download_stopped(cache, f"http://127.0.0.1:{proxy.port}", signal.SIGKILL)
    assert build_info(path) is None  # a killed process cleans nothing up, but nothing is taken for a model
    assert sum(p.stat().st_size for p in parts.iterdir()) >= held  # the part is kept, never cut back

    load_tiny(MODEL, cache_dir=cache, progress=False, fetch=fetcher(server.url, MODEL, out=io.StringIO()))
    assert sorted(p.name for p in cache.iterdir()) == [path.name, f"{path.name}.lock"]  # the leftovers went
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
