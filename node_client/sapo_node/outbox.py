"""The outbox: a durable on-disk queue of shared groups waiting for the server's verdict.

A group is written here (and committed to disk) before any attempt to send it. It stays pending
until the server acknowledges it, accepted or rejected; after a lost connection every pending group
of the node's swarm is sent again, and since the server treats a resent id idempotently, each group
is stored once by the pool. A rejected group keeps its reason and is never sent again. sqlite3
(stdlib) gives atomic commits, so a crash between two writes loses nothing that was committed.

An accepted group keeps its text for ACK_RETENTION_SECONDS after its acknowledgement (then only its
id and verdict stay): if the server's database is restored from a backup older than that, the
groups it lost are sent again (`requeue_acknowledged`, when the pool's epoch in `welcome` changes:
platform/sockets/epoch.py). The epoch last seen is kept here too, with the server it came from
(`epoch`, `set_epoch`): a node pointed at another server meets another epoch, and that is no
restore, so nothing is sent again for it.

Each group records the swarm it was made for (the slug of the `welcome` the node had when it made
the group: docs/protocol.md, "hello -> welcome") and goes only to that swarm: a pending group of
another swarm waits for the node to join it again. A group with no swarm (made before any welcome
named one, or queued by a client older than the column) belongs to the swarm of the next hello the
server answers: the welcome's swarm claims it (`claim`), and a hello refused as `swarm_retired`
claims it for that retired swarm. When the node learns that a swarm is retired, its pending groups
are dropped (rejected with the reason `swarm_retired`, never sent anywhere) and its accepted groups
lose their text, so a change of the pool's epoch does not send them again (`drop_swarm`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from sapo_node import protocol
from sapo_node.ids import uuid7

PENDING, ACCEPTED, REJECTED = "pending", "accepted", "rejected"
#: A group the node refused itself and never sent (text the pool cannot store, a retired swarm's
#: group): not the pool's verdict, so counted apart from REJECTED, which the site's figures match.
REFUSED = "refused"

#: Seconds an accepted group's text is kept after its acknowledgement, to be sent again to a server
#: restored from a backup (docs/deploy.md, "Backups and restore": longer than the time between backups).
ACK_RETENTION_SECONDS = 3 * 86_400
#: Seconds between two clean-ups of the texts past the retention.
PRUNE_EVERY_SECONDS = 3600.0


class Outbox:
    """Thread-safe: the training thread adds, the network thread takes and marks."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS outbox ("
            " seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, payload TEXT,"
            " state TEXT NOT NULL, reason TEXT, created REAL NOT NULL, done REAL, swarm TEXT)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "swarm" not in columns:  # a file of an older client: its groups have no swarm (see above)
            with self._db:
                self._db.execute("ALTER TABLE outbox ADD COLUMN swarm TEXT")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._pruned_at = 0.0

    def put(self, rollouts: list[dict[str, Any]], swarm: str | None = None) -> None:
        """Queue wire-form rollouts made for `swarm` (None: no swarm known yet); an id already queued
        is left as it is."""
        now = time.time()
        with self._lock, self._db:
            self._db.executemany(
                "INSERT OR IGNORE INTO outbox (id, payload, state, created, swarm) VALUES (?, ?, ?, ?, ?)",
                [(r["id"], json.dumps(r), PENDING, now, swarm) for r in rollouts],
            )
            if now - self._pruned_at > PRUNE_EVERY_SECONDS:
                self._pruned_at = now
                self._db.execute(
                    "UPDATE outbox SET payload = NULL WHERE state = ? AND payload IS NOT NULL AND done < ?",
                    (ACCEPTED, now - ACK_RETENTION_SECONDS),
                )

    def pending(
        self, limit: int = 1000, exclude: set[str] | frozenset[str] = frozenset(), *, swarm: str | None = None
    ) -> list[dict[str, Any]]:
        """The oldest pending rollouts (wire form) made for `swarm` (None: those with no swarm),
        skipping ids in `exclude` (those in flight)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, payload FROM outbox WHERE state = ? AND swarm IS ? ORDER BY seq LIMIT ?",
                (PENDING, swarm, limit + len(exclude)),
            ).fetchall()
        return [json.loads(payload) for id_, payload in rows if id_ not in exclude][:limit]

    def pending_weights(self) -> set[str]:
        """The weights digests named by the proofs of pending groups (sapo_node.commitments keeps
        their files: the pool's ack of them may ask for an audit)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT json_extract(payload, '$.proof.weights') FROM outbox WHERE state = ?"
                " AND payload IS NOT NULL",
                (PENDING,),
            ).fetchall()
        return {row[0] for row in rows if isinstance(row[0], str)}

    def waiting(self) -> dict[str | None, int]:
        """How many groups are pending for each swarm (None: with no swarm yet)."""
        with self._lock:
            return dict(
                self._db.execute("SELECT swarm, COUNT(*) FROM outbox WHERE state = ? GROUP BY swarm", (PENDING,))
            )

    def claim(self, swarm: str) -> int:
        """Give the groups that have no swarm to `swarm`, the first one a hello was answered for;
        returns how many of them are pending."""
        with self._lock, self._db:
            pending = self._db.execute(
                "SELECT COUNT(*) FROM outbox WHERE swarm IS NULL AND state = ?", (PENDING,)
            ).fetchone()[0]
            self._db.execute("UPDATE outbox SET swarm = ? WHERE swarm IS NULL", (swarm,))
        return pending

    def drop_swarm(self, swarm: str) -> int:
        """`swarm` is retired: its pending groups are refused with the reason `swarm_retired` (their
        text dropped: never sent to it or to any other swarm), and its accepted ones lose their text,
        so no change of epoch sends them again. Returns how many pending groups were dropped."""
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE outbox SET state = ?, reason = ?, done = ?, payload = NULL WHERE state = ? AND swarm = ?",
                (REFUSED, protocol.SWARM_RETIRED, time.time(), PENDING, swarm),
            )
            self._db.execute(
                "UPDATE outbox SET payload = NULL WHERE state = ? AND swarm = ? AND payload IS NOT NULL",
                (ACCEPTED, swarm),
            )
        return cur.rowcount

    def mark(self, id_: str, state: str, reason: str | None = None) -> bool:
        """Record the server's verdict on a pending group, or the node's own refusal (a rejected or
        refused group's text is dropped, an accepted one's kept for ACK_RETENTION_SECONDS); False if
        not pending."""
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE outbox SET state = ?, reason = ?, done = ?,"
                " payload = CASE WHEN ? = ? THEN payload END WHERE id = ? AND state = ?",
                (state, reason, time.time(), state, ACCEPTED, id_, PENDING),
            )
        return cur.rowcount == 1

    def rekey(self, id_: str) -> str | None:
        """Give a pending group a fresh id (a UUIDv7 of now) and keep it pending under it: the pool
        answered `bad_id` (its id is not a UUIDv7 of the last days, e.g. a group queued by an older
        client), which it does only for an id it does not hold, so the group is stored once. Returns the
        new id (None: not pending)."""
        with self._lock, self._db:
            row = self._db.execute("SELECT payload FROM outbox WHERE id = ? AND state = ?", (id_, PENDING)).fetchone()
            if row is None or row[0] is None:
                return None
            rollout = json.loads(row[0])
            rollout["id"] = new = str(uuid7())
            self._db.execute("UPDATE outbox SET id = ?, payload = ? WHERE id = ?", (new, json.dumps(rollout), id_))
        return new

    def requeue_acknowledged(self, since: float) -> int:
        """Make the accepted groups acknowledged at or after `since` (Unix time) that still have their
        text pending again (sent again); returns how many."""
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE outbox SET state = ?, reason = NULL, done = NULL"
                " WHERE state = ? AND payload IS NOT NULL AND done >= ?",
                (PENDING, ACCEPTED, since),
            )
        return cur.rowcount

    def epoch(self, server: str) -> str | None:
        """The pool epoch this node last saw at `server` (None: none yet, or it last saw another server)."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'pool_epoch'").fetchone()
        if row is None:
            return None
        try:
            seen = json.loads(row[0])
        except ValueError:  # the bare epoch an older client wrote: its server is unknown
            return None
        return seen.get("epoch") if isinstance(seen, dict) and seen.get("server") == server else None

    def set_epoch(self, server: str, epoch: str) -> None:
        value = json.dumps({"server": server, "epoch": epoch})
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('pool_epoch', ?)", (value,))

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall()
        counts = {PENDING: 0, ACCEPTED: 0, REJECTED: 0, REFUSED: 0}
        counts.update(dict(rows))
        return counts

    def rejections(self) -> list[tuple[str, str | None]]:
        """(id, reason) of the groups the pool rejected."""
        return self._of_state(REJECTED)

    def refusals(self) -> list[tuple[str, str | None]]:
        """(id, reason) of the groups the node refused itself, never sent."""
        return self._of_state(REFUSED)

    def _of_state(self, state: str) -> list[tuple[str, str | None]]:
        with self._lock:
            return self._db.execute("SELECT id, reason FROM outbox WHERE state = ? ORDER BY seq", (state,)).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()
