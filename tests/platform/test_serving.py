"""`manage.py sapo_serve` (ops.serving): the command each ASGI server is started with."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from ops.serving import BACKLOG, HANDSHAKE_SECONDS, server_argv
from pool.limits import current_limits
from sapo_node.transport.websocket import OPEN_TIMEOUT


def test_daphne_waits_as_long_as_a_node_for_the_handshake_and_keeps_a_deep_backlog():
    argv = server_argv("daphne", host="127.0.0.1", port=8001, websocket_max_bytes=1)
    assert argv[1:3] == ["-m", "daphne"]
    assert HANDSHAKE_SECONDS == OPEN_TIMEOUT
    assert argv[argv.index("--websocket_connect_timeout") + 1] == str(HANDSHAKE_SECONDS)
    assert f"tcp:port=8001:interface=127.0.0.1:backlog={BACKLOG}" in argv
    assert argv[argv.index("-v") + 1] == "0"  # no access log
    assert argv[-1] == "config.asgi:application"


def test_uvicorn_gets_the_frame_limit_no_compression_and_no_proxy_headers():
    argv = server_argv("uvicorn", host="0.0.0.0", port=8000, websocket_max_bytes=12345)  # noqa: S104
    assert argv[1:3] == ["-m", "uvicorn"]
    for option, value in {
        "--ws-max-size": "12345",
        "--ws-per-message-deflate": "false",
        "--backlog": str(BACKLOG),
        "--lifespan": "on",
        "--log-level": "warning",  # no lines per socket
        "--port": "8000",
    }.items():
        assert argv[argv.index(option) + 1] == value
    assert "--no-access-log" in argv and "--no-proxy-headers" in argv
    assert argv[-1] == "config.asgi:application"


def test_an_unknown_server_is_refused():
    with pytest.raises(ValueError, match="unknown ASGI server"):
        server_argv("gunicorn", host="127.0.0.1", port=1, websocket_max_bytes=1)


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_sapo_serve_prints_the_command_with_the_settings_frame_limit(server, settings):
    settings.SAPO_ASGI_SERVER = server
    out = io.StringIO()
    call_command("sapo_serve", "--print", "--port", "8123", stdout=out)
    assert f"-m {server} " in out.getvalue()
    assert "8123" in out.getvalue()
    if server == "uvicorn":
        assert f"--ws-max-size {current_limits().websocket_max_bytes} " in out.getvalue()


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_sapo_serve_runs_from_any_directory_with_no_pythonpath(server, tmp_path):
    """As docs/deploy.md runs it: `manage.py sapo_serve` from another working directory, with no
    platform folder on PYTHONPATH, serves /healthz (the server imports config.asgi in a new interpreter)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    platform_dir = str(settings.PLATFORM_DIR)
    env = dict(os.environ)
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != Path(platform_dir)]
    if kept:  # a checkout's node_client, say: only the platform folder is what the command must add
        env["PYTHONPATH"] = os.pathsep.join(kept)
    manage = Path(settings.BASE_DIR) / "manage.py"
    argv = [sys.executable, str(manage), "sapo_serve", "--server", server, "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*argv, "--port", str(port)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"sapo_serve exited {process.returncode}: {process.stdout.read().decode()[-2000:]}")
                assert time.monotonic() < deadline, "sapo_serve did not answer /healthz within 90 s"
                time.sleep(0.5)
    finally:
        process.terminate()
        process.wait(timeout=30)
