"""A run folder may come from someone else: `sapo-node run --resume` must not send the user's token to
the server its config.json names unless the user names that server too."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from node_toys import make_policy

from sapo_node import loop
from sapo_node.cli import main

TOKEN = "the-users-own-token"


class Listener:
    """A plain TCP listener standing for the hostile server: it records every connection and the
    bytes each one sends (a WebSocket upgrade carries the token in its Authorization header)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.sock.getsockname()[1]}/ws/node/"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                        data += chunk
                except OSError:
                    pass
                self.received.append(data)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def hostile():
    listener = Listener()
    yield listener
    listener.stop()


@pytest.fixture
def folder(tmp_path, hostile, monkeypatch):
    """Someone else's run folder: its config.json names their server."""
    monkeypatch.setattr(loop, "load_model", lambda config: make_policy("a", seed=0))
    monkeypatch.setenv("SAPO_TOKEN", TOKEN)
    monkeypatch.delenv("SAPO_SERVER", raising=False)
    config = {
        "model": "tiny",
        "offline": False,
        "server": hostile.url,
        "questions": 2,
        "generations": 2,
        "max_new_tokens": 6,
        "local": 2,
        "seed": 5,
        "rounds": 1,
        "connect_wait": 0.2,
        "flush_wait": 0.2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_resume_refuses_the_folders_server_and_connects_nowhere(folder, hostile, capsys):
    code = main(["run", "--resume", "--out", str(folder)])

    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"names the server '{hostile.url}'" in err and f"--server {hostile.url}" in err and "--offline" in err
    time.sleep(0.5)
    assert hostile.received == []


def test_resume_with_another_server_in_the_environment_is_refused_too(folder, hostile, monkeypatch, capsys):
    monkeypatch.setenv("SAPO_SERVER", "ws://127.0.0.1:9/ws/node/")

    code = main(["run", "--resume", "--out", str(folder)])

    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "SAPO_SERVER is 'ws://127.0.0.1:9/ws/node/'" in err and "--server ws://127.0.0.1:9/ws/node/" in err
    time.sleep(0.5)
    assert hostile.received == []


def test_resume_offline_runs_and_connects_nowhere(folder, hostile):
    assert main(["run", "--resume", "--offline", "--out", str(folder)]) == 0

    assert json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])["connection"] == "silo"
    assert hostile.received == []


def test_naming_the_folders_server_with_the_flag_sends_the_token_there(folder, hostile):
    # The listener does see a connection when the user names its server: the refusals above are real.
    assert main(["run", "--resume", "--out", str(folder), "--server", hostile.url]) == 0

    deadline = time.monotonic() + 5
    while not hostile.received and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hostile.received and f"Bearer {TOKEN}".encode() in hostile.received[0]
