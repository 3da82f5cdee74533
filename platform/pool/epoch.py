"""The pool's epoch: a name for the database's history that changes when the database is restored
from a backup, sent in every `welcome` (docs/protocol.md, "hello -> welcome"; docs/deploy.md,
"Backups and restore").

A restore brings the pool back to the moment of the backup: groups acknowledged after it are gone
from the server, but their nodes still hold them (sapo_node.outbox keeps an acknowledged group's text
for ACK_RETENTION_SECONDS). A node that sees the epoch change sends those groups again; the server
stores the ones it does not know and answers the others as before (a resent id is idempotent).

The epoch is read from PostgreSQL itself, so no restore procedure can forget to change it: the
cluster's system identifier (a new one for a cluster made by initdb, where a dump is restored), its
timeline (a new one after every archive recovery: point-in-time recovery, a base backup restored, a
replica promoted) and the database's OID (a new one for a database created again to restore a dump
into). A copy of a stopped cluster's data directory put back in place changes none of them; the
restore procedure in docs/deploy.md says what to do then.
"""

from __future__ import annotations

import hashlib
import time

from django.db import connection

from common.db import db_call

#: Seconds a process keeps the epoch it read (the site processes restart after a restore anyway).
REFRESH_SECONDS = 60.0

# Raw SQL: the ORM has no access to PostgreSQL's control data.
_EPOCH_SQL = """
SELECT s.system_identifier, c.timeline_id, d.oid
FROM pg_control_system() AS s, pg_control_checkpoint() AS c, pg_database AS d
WHERE d.datname = current_database()
"""

_cached: tuple[float, str] | None = None


def pool_epoch() -> str:
    """The epoch as the database says it now: 16 hex characters."""
    with connection.cursor() as cursor:
        cursor.execute(_EPOCH_SQL)
        system, timeline, oid = cursor.fetchone()
    return hashlib.sha256(f"{system}:{timeline}:{oid}".encode()).hexdigest()[:16]


async def current_pool_epoch() -> str:
    """pool_epoch(), read at most once every REFRESH_SECONDS per process."""
    global _cached
    now = time.monotonic()
    if _cached is None or now - _cached[0] > REFRESH_SECONDS:
        _cached = (now, await db_call(pool_epoch)())
    return _cached[1]


def forget_pool_epoch() -> None:
    """Read the epoch again at the next welcome (tests)."""
    global _cached
    _cached = None
