"""The node's pause gate (sapo_node.pause) and the client's side of a pause (sapo_node.transport.websocket's
frames and version check)."""

from __future__ import annotations

import threading
import time

import pytest

from sapo_node import protocol
from sapo_node.pause import PauseGate, pause_line
from sapo_node.transport.websocket import WebSocketTransport, newer_client, version_key


def test_the_gate_opens_only_when_every_reason_is_released():
    gate = PauseGate()
    changes: list[frozenset[str]] = []
    gate.on_change = changes.append
    assert not gate.paused
    assert gate.pause("site") and not gate.pause("site")  # a reason holds once
    assert gate.pause("battery")
    assert gate.resume("site") and gate.paused  # the site's resume leaves the machine's reason
    assert not gate.resume("site")
    assert gate.resume("battery") and not gate.paused
    assert changes == [frozenset({"site"}), frozenset({"site", "battery"}), frozenset({"battery"}), frozenset()]
    with pytest.raises(ValueError):
        gate.pause("")


def test_wait_returns_at_once_on_an_open_gate_and_blocks_until_resumed():
    gate = PauseGate()
    told: list[frozenset[str]] = []
    assert gate.wait(on_pause=told.append) == 0.0 and told == []

    gate.pause("site")
    threading.Timer(0.3, gate.resume, args=("site",)).start()
    waited = gate.wait(on_pause=told.append, poll=5.0)  # woken by the resume, not by the poll
    assert 0.25 <= waited < 3.0
    assert told == [frozenset({"site"})]


def test_wait_ends_when_the_node_stops():
    gate = PauseGate()
    gate.pause("site")
    stop_at = time.monotonic() + 0.2
    waited = gate.wait(stop=lambda: time.monotonic() >= stop_at, poll=0.05)
    assert 0.15 <= waited < 2.0 and gate.paused


def test_the_pause_line_names_its_reasons():
    assert pause_line(frozenset({"site"})) == "paused from the site (resume on /me/)"
    assert pause_line(frozenset({"site", "update"})) == "paused from the site (resume on /me/); paused (update)"
    assert pause_line(frozenset({"battery"}), {"battery": "on battery since 9:00"}) == (
        "paused while on battery (--pause-on-battery): on battery since 9:00"
    )


def test_pause_frames_hold_and_release_the_site_reason_of_the_attached_gate(tmp_path):
    transport = WebSocketTransport("ws://127.0.0.1:9/ws/node/", None, tmp_path / "outbox.sqlite3")
    try:
        gate = PauseGate()
        gate.pause("battery")
        transport.attach_gate(gate)
        transport._on_pause({"type": protocol.PAUSE, "paused": True})
        assert gate.reasons == {"site", "battery"}
        transport._on_pause({"type": protocol.PAUSE, "paused": "yes"})  # not a boolean: nothing changes
        assert gate.reasons == {"site", "battery"}
        transport._on_pause({"type": protocol.PAUSE, "paused": False})
        assert gate.reasons == {"battery"}
    finally:
        transport.close()


def test_a_pause_a_welcome_brought_before_the_loop_attached_its_gate_carries_over(tmp_path):
    transport = WebSocketTransport("ws://127.0.0.1:9/ws/node/", None, tmp_path / "outbox.sqlite3")
    try:
        transport._on_pause({"type": protocol.PAUSE, "paused": True})
        gate = PauseGate()
        transport.attach_gate(gate)
        assert gate.reasons == {"site"}
    finally:
        transport.close()


@pytest.mark.parametrize(
    ("latest", "current", "newer"),
    [
        ("0.2.0", "0.1.0", "0.2.0"),
        ("0.10.0", "0.9.3", "0.10.0"),
        ("0.1.0", "0.1.0", None),
        ("0.0.9", "0.1.0", None),
        ("1.0.0rc1", "0.1.0", None),  # not dotted numbers: never nags
        (None, "0.1.0", None),
        ("9" * 50, "0.1.0", None),
    ],
)
def test_the_client_names_a_newer_version_only(latest, current, newer):
    assert newer_client(latest, current) == newer


def test_version_keys():
    assert version_key("0.10.2") == (0, 10, 2)
    assert version_key("1.2.x") is None
