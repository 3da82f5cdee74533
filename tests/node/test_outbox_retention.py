"""sapo_node.outbox: an accepted group's text is kept for ACK_RETENTION_SECONDS, to be sent again to a
server restored from a backup (docs/deploy.md, "Backups and restore"); a rejected one's is dropped."""

from __future__ import annotations

import time

from sapo_node import outbox as outbox_module
from sapo_node.outbox import ACCEPTED, PENDING, REFUSED, REJECTED, Outbox


def rollout(i: int) -> dict:
    return {"id": f"g{i}", "round": 1, "question": "q", "answer": "a", "completions": ["x"], "rewards": [1.0]}


def test_accepted_groups_are_sent_again_within_the_retention_and_dropped_after_it(tmp_path, monkeypatch) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    box.put([rollout(1), rollout(2), rollout(3)])
    assert box.mark("g1", ACCEPTED) and box.mark("g2", REJECTED, "wrong") and box.mark("g3", ACCEPTED)
    assert box.pending() == []
    assert box.epoch("wss://a.example/ws/node/") is None
    box.set_epoch("wss://a.example/ws/node/", "a")
    assert box.epoch("wss://a.example/ws/node/") == "a"

    assert box.requeue_acknowledged(time.time() - outbox_module.ACK_RETENTION_SECONDS) == 2
    assert [r["id"] for r in box.pending()] == ["g1", "g3"]  # the rejected one is not sent again
    assert box.counts()[PENDING] == 2

    box.mark("g1", ACCEPTED)
    box.mark("g3", ACCEPTED)
    later = time.time() + outbox_module.ACK_RETENTION_SECONDS + 10
    monkeypatch.setattr(outbox_module.time, "time", lambda: later)
    box.put([rollout(4)])  # a put cleans up the texts past the retention
    assert box.requeue_acknowledged(0) == 0
    assert [r["id"] for r in box.pending()] == ["g4"]
    box.close()


def test_an_epoch_is_known_for_the_server_it_came_from_only(tmp_path) -> None:
    """A node pointed at another server meets another epoch: no restore, so nothing is sent again."""
    box = Outbox(tmp_path / "o.sqlite3")
    box.set_epoch("wss://a.example/ws/node/", "a")
    assert box.epoch("wss://b.example/ws/node/") is None
    box.set_epoch("wss://b.example/ws/node/", "b")
    assert box.epoch("wss://a.example/ws/node/") is None
    assert box.epoch("wss://b.example/ws/node/") == "b"
    box.close()


def test_a_pending_group_is_rekeyed_with_a_fresh_uuid7_and_stays_pending(tmp_path) -> None:
    """The pool answers `bad_id` to an id it does not hold that is no recent UUIDv7 (a group queued by
    an older client): the group goes again under a fresh id; an acknowledged one is not touched."""
    import uuid

    from sapo_node.ids import is_uuid7

    box = Outbox(tmp_path / "o.sqlite3")
    old = str(uuid.uuid4())
    box.put([{**rollout(1), "id": old}, rollout(2)])
    box.mark("g2", ACCEPTED)
    new = box.rekey(old)
    assert new is not None and is_uuid7(uuid.UUID(new))
    assert [r["id"] for r in box.pending()] == [new]
    assert box.rekey(old) is None and box.rekey("g2") is None
    assert box.counts() == {PENDING: 1, ACCEPTED: 1, REJECTED: 0, REFUSED: 0}
    box.close()
