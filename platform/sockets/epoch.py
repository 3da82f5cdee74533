"""The pool's epoch: a name for the database's history that changes when the database is restored
from a backup, sent in every `welcome` (docs/protocol.md, "hello -> welcome"; docs/deploy.md,
"Backups and restore").

A restore brings the pool back to the moment of the backup: groups acknowledged after it are gone
from the server, but their nodes still hold them (sapo_node.outbox keeps an acknowledged group's text
for ACK_RETENTION_SECONDS). A node that sees the epoch change sends those groups again; the server
stores the ones it does not know and answers the others as before (a resent id is idempotent).

The epoch is read from PostgreSQL itself, so no restore procedure can forget to change it. It hashes:

- the marker row (`EpochMarker`): its `xmin`, the id of the transaction that inserted it, and its
  random token. Every restore of the pool's contents inserts the row again, so its xmin is new, by
  whatever method: `pg_restore --clean` into the same database, a schema dropped and restored, a
  database or a cluster created again. Nothing else writes the row; a missing one is made again (with
  a token of its own), which is also how an operator renews the epoch by hand: deleting the row.
- the cluster's system identifier (new for a cluster made by initdb: a dump restored into a new
  cluster starts its transaction ids afresh, so its xmin alone could repeat an older one);
- its timeline (new after every archive recovery: point-in-time recovery, a base backup restored, a
  replica promoted; these copy pages, the marker's xmin with them);
- the database's OID (new for a database created again).

What keeps the row's xmin (checked with PostgreSQL 18; tests/platform/test_pool_epoch.py checks the
first three): VACUUM FREEZE marks a row frozen with flag bits and keeps its xmin (since PostgreSQL
9.4); VACUUM FULL and CLUSTER copy rows with their transaction ids (rewriteheap.c, "preserving
visibility information"); `SELECT ... FOR UPDATE` sets xmax only. pg_upgrade reuses the data files
and gives the new cluster the old one's next transaction id, so the xmin and the database's OID stay,
but the cluster initdb made for it has a new system identifier: the epoch changes once and the nodes
send again what they hold, which costs a resend and loses nothing. A migration that rewrites this
table (ALTER TABLE ... TYPE) inserts the row anew: the same. A copy of a stopped cluster's data
directory put back in place changes nothing PostgreSQL reports, and brings back a transaction counter
that hands out the same ids again: docs/deploy.md has the operator delete the row then, and the new
row's random token makes the epoch new.
"""

from __future__ import annotations

import hashlib
import time
import uuid

from django.db import connection

from common.db import db_call
from pool.models import EpochMarker

#: Seconds a process keeps the epoch it read (the site processes restart after a restore anyway).
REFRESH_SECONDS = 60.0

# Raw SQL: the ORM reads neither PostgreSQL's control data nor a row's xmin.
_EPOCH_SQL = """
SELECT s.system_identifier, c.timeline_id, d.oid, m.xmin::text, m.token::text
FROM pg_control_system() AS s, pg_control_checkpoint() AS c, pg_database AS d
LEFT JOIN pool_epochmarker AS m ON m.id = 1
WHERE d.datname = current_database()
"""

_cached: tuple[float, str] | None = None


def pool_epoch() -> str:
    """The epoch as the database says it now: 16 hex characters. Makes the marker row if it is missing."""
    with connection.cursor() as cursor:
        cursor.execute(_EPOCH_SQL)
        system, timeline, oid, xmin, token = cursor.fetchone()
        if xmin is None:  # never made, or deleted to renew the epoch; another process may make it first
            EpochMarker.objects.bulk_create([EpochMarker(token=uuid.uuid4())], ignore_conflicts=True)
            cursor.execute(_EPOCH_SQL)
            system, timeline, oid, xmin, token = cursor.fetchone()
    return hashlib.sha256(f"{system}:{timeline}:{oid}:{xmin}:{token}".encode()).hexdigest()[:16]


async def current_pool_epoch() -> str:
    """pool_epoch(), read at most once every REFRESH_SECONDS per process."""
    global _cached
    now = time.monotonic()
    if _cached is None or now - _cached[0] > REFRESH_SECONDS:
        _cached = (now, await db_call(pool_epoch)())
    return _cached[1]
