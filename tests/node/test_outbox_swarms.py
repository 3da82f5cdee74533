"""sapo_node.outbox records the swarm each group was made for: pending groups are taken per swarm, an
outbox file written before the column existed is migrated (its groups belong to the swarm of the
first hello answered after the upgrade), and a retired swarm's groups are dropped, their text gone,
so no epoch change sends them again."""

from __future__ import annotations

import json
import sqlite3
import time

from sapo_node import protocol
from sapo_node.outbox import ACCEPTED, PENDING, REFUSED, REJECTED, Outbox


def rollout(i: int) -> dict:
    return {"id": f"g{i}", "round": 1, "question": "q", "answer": "a", "completions": ["x"], "rewards": [1.0]}


def ids(rollouts: list[dict]) -> list[str]:
    return [r["id"] for r in rollouts]


def test_pending_groups_are_taken_per_swarm_and_counted_per_swarm(tmp_path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    box.put([rollout(1), rollout(2)], swarm="easy")
    box.put([rollout(3)], swarm="math")
    box.put([rollout(4)])  # made before any welcome named a swarm
    assert ids(box.pending(swarm="easy")) == ["g1", "g2"]
    assert ids(box.pending(swarm="math")) == ["g3"]
    assert ids(box.pending()) == ["g4"]
    assert box.waiting() == {"easy": 2, "math": 1, None: 1}
    box.close()
    box = Outbox(tmp_path / "o.sqlite3")  # the swarm is on disk, like the group
    assert ids(box.pending(swarm="math")) == ["g3"]
    box.close()


def test_groups_without_a_swarm_are_claimed_by_the_first_swarm_that_answers(tmp_path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    box.put([rollout(1), rollout(2)])
    box.put([rollout(3)], swarm="math")
    box.mark("g2", ACCEPTED)
    assert box.claim("easy") == 1  # the pending one; the accepted one is its too
    assert box.claim("main") == 0
    assert ids(box.pending(swarm="easy")) == ["g1"] and ids(box.pending(swarm="math")) == ["g3"]
    assert box.requeue_acknowledged(0) == 1
    assert ids(box.pending(swarm="easy")) == ["g1", "g2"]
    box.close()


def test_an_outbox_file_of_an_older_client_gains_the_swarm_column(tmp_path) -> None:
    path = tmp_path / "o.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE outbox ("
        " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, payload TEXT,"
        " state TEXT NOT NULL, reason TEXT, created REAL NOT NULL, done REAL)"
    )
    old.executemany(
        "INSERT INTO outbox (id, payload, state, created) VALUES (?, ?, ?, ?)",
        [(f"g{i}", json.dumps(rollout(i)), PENDING, time.time()) for i in (1, 2)],
    )
    old.commit()
    old.close()

    box = Outbox(path)
    assert box.waiting() == {None: 2}
    box.put([rollout(3)], swarm="easy")
    assert box.claim("easy") == 2
    assert ids(box.pending(swarm="easy")) == ["g1", "g2", "g3"]
    box.close()
    assert ids(Outbox(path).pending(swarm="easy")) == ["g1", "g2", "g3"]  # migrated once, opened again


def test_a_retired_swarms_groups_are_dropped_and_never_sent_again(tmp_path) -> None:
    box = Outbox(tmp_path / "o.sqlite3")
    box.put([rollout(1), rollout(2), rollout(3)], swarm="old")
    box.put([rollout(4)], swarm="easy")
    box.mark("g3", ACCEPTED)  # acknowledged, its text kept for a restore of the pool
    box.mark("g4", ACCEPTED)

    assert box.drop_swarm("old") == 2
    assert box.pending(swarm="old") == [] and box.waiting() == {}
    # The node's own refusal, never the pool's verdict: counted apart from the rejections.
    assert box.refusals() == [("g1", protocol.SWARM_RETIRED), ("g2", protocol.SWARM_RETIRED)]
    assert box.rejections() == []
    assert box.counts() == {PENDING: 0, ACCEPTED: 2, REJECTED: 0, REFUSED: 2}
    assert box.requeue_acknowledged(0) == 1  # the pool's epoch changed: only the open swarm's group
    assert ids(box.pending(swarm="easy")) == ["g4"] and box.pending(swarm="old") == []
    assert box.drop_swarm("old") == 0
    box.close()
