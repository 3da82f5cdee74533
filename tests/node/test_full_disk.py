"""A node on a full disk (a real filesystem: a small tmpfs mounted for the test, filled, then freed; the
test runs as root, as .ci/run does): the transport keeps sharing, sampling and the server's verdicts
(in memory until the outbox can be written again), checkpoints and the metrics log fail softly, and
each says so once in the log."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from factories import make_node_with_token
from support.pool import make_group, share_frame
from websockets.sync.client import connect

from sapo_node.checkpoint import TrainingState, list_checkpoints, save_checkpoint
from sapo_node.groups import Group
from sapo_node.metrics import MetricsLog
from sapo_node.tasks import SAPO_CATALOGUE, TaskStream
from sapo_node.transport.base import Hello
from sapo_node.transport.websocket import WebSocketTransport

TIMEOUT = 30.0


@contextmanager
def small_disk(tmp_path: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` mounted for the test (root only: mount(8))."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk`; returns the file that holds them (delete it to free them)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def wait_for(condition, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (result := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return result


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_transport_rides_out_a_full_disk_and_resumes_when_space_returns(live_server, tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sapo_node.transport")
    _, author_token = make_node_with_token()
    with connect(
        f"{live_server.ws_url}/ws/node/", additional_headers={"Authorization": f"Bearer {author_token}"}
    ) as author:  # another node's groups in the pool, to sample
        author.send(json.dumps({"type": "hello", "v": 1}))
        assert json.loads(author.recv(timeout=TIMEOUT))["type"] == "welcome"
        author.send(json.dumps(share_frame(*(make_group(index=i, seed=77) for i in range(6)), ref="a")))
        assert len(json.loads(author.recv(timeout=TIMEOUT))["accepted"]) == 6
    _, token = make_node_with_token()
    with small_disk(tmp_path) as disk:
        transport = WebSocketTransport(
            f"{live_server.ws_url}/ws/node/", token, disk / "outbox.sqlite3", poll_interval=0.2
        )
        mine = [Group.from_wire(make_group(index=100 + i, seed=78)) for i in range(3)]
        transport.share(mine)  # on disk; sent once the transport connects
        filler = fill(disk)
        try:
            transport.start(Hello(client="t", model="m", hardware="h", local=3, external=4))
            assert transport.wait_connected(TIMEOUT)
            # Their acknowledgement arrives while the outbox cannot be written: the transport goes on.
            later = [Group.from_wire(make_group(index=200, seed=78))]
            transport.share(later)  # the disk cannot take it either: it waits in memory
            taken = wait_for(lambda: transport.take_external(4))
            assert taken, "sampling goes on with a full disk"
            time.sleep(1.0)
            assert transport._thread.is_alive() and transport.status == "connected"
            assert transport.counts().accepted == 0  # nothing could be written yet
            filler.unlink()
            assert wait_for(lambda: transport.counts().accepted == 4), transport.counts()
            assert transport.counts().pending == 0
        finally:
            transport.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "sapo_node.transport"]
    assert sum("cannot be written" in m for m in messages) == 1, messages
    assert sum("can be written again" in m for m in messages) == 1, messages


def test_a_checkpoint_on_a_full_disk_fails_softly_and_leaves_nothing_behind(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="sapo_node.checkpoint")
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights, 2 more of optimizer state
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    state = TrainingState(model, optimizer, TaskStream(SAPO_CATALOGUE, 1), random.Random(1))
    with small_disk(tmp_path, size="8m") as disk:
        assert save_checkpoint(disk, 1, state) is not None
        filler = fill(disk)
        assert save_checkpoint(disk, 2, state) is None  # the run goes on
        assert save_checkpoint(disk, 3, state) is None
        assert [p.name for p in list_checkpoints(disk)] == ["round-000001"]  # the previous one intact
        assert [p.name for p in (disk / "checkpoints").iterdir()] == ["round-000001"]  # no temporary folder
        metrics = MetricsLog(disk / "metrics.jsonl")
        metrics.write({"round": 2, "text": "x" * 10_000})  # no room: left out whole
        filler.unlink()
        metrics.write({"round": 3})
        assert metrics.read() == [{"round": 3}]
        assert save_checkpoint(disk, 4, state) is not None
        assert [p.name for p in list_checkpoints(disk)] == ["round-000001", "round-000004"]
    messages = [r.getMessage() for r in caplog.records if r.name == "sapo_node.checkpoint"]
    assert sum("not written" in m for m in messages) == 1, messages
    assert sum("written again" in m for m in messages) == 1, messages
