"""A node socket's session, opened in one statement: the bearer token checked again, the node's
standing (banned, retired), the token's last use, the node's last seen and the socket's presence
record, in one database round trip (docs/benchmarks.md, "Sockets").

Raw SQL, not the ORM, on purpose: the socket opens under load all at once (a server restart brings
every node back within seconds), and Django building and sending the same reads and writes as seven
statements cost ~2.4 ms of CPU per socket, most of the one process's budget; this costs ~0.3 ms.
The semantics are nodes.services.node_authenticate's (touch=True) and presence.connection_open's:
the checks and the writes are one statement, so a node found banned or retired writes nothing.
"""

from __future__ import annotations

import uuid
from contextlib import nullcontext
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.db import server_binding_cursor
from common.errors import ApplicationError
from nodes import presence
from nodes.models import Node
from nodes.services import SEEN_WRITE_INTERVAL, node_from_row, node_select_columns, token_hash, token_is_well_formed

# One statement in its own transaction (autocommit), whose commit does not wait for the disk: the
# writes are bookkeeping (common.db.bookkeeping_transaction says why; set_config(..., true) lasts for
# this statement's transaction, one round trip). The writes see the read's snapshot only through
# `seen`: the node's row is updated only while neither it nor its owner is banned (checked again on
# the locked row), and nothing else is written unless it was.
_SESSION_OPEN_SQL = f"""
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),
auth AS (
    SELECT t.id AS token_id, n.retired_at IS NOT NULL AS retired,
           n.banned_at IS NOT NULL OR u.banned_at IS NOT NULL AS banned, {node_select_columns("n")}
    FROM nodes_nodetoken t JOIN nodes_node n ON n.id = t.node_id JOIN accounts_user u ON u.id = n.owner_id
    WHERE t.token_hash = %(hash)s AND t.revoked_at IS NULL
),
seen AS (
    UPDATE nodes_node n SET last_seen_at = %(now)s
    FROM accounts_user u
    WHERE n.id = (SELECT id FROM auth WHERE NOT retired AND NOT banned) AND u.id = n.owner_id
      AND n.banned_at IS NULL AND u.banned_at IS NULL
    RETURNING n.id
),
used AS (
    UPDATE nodes_nodetoken SET last_used_at = %(now)s
    WHERE id = (SELECT token_id FROM auth) AND EXISTS (SELECT 1 FROM seen)
      AND (last_used_at IS NULL OR last_used_at < %(used_before)s)
),
present AS (
    INSERT INTO nodes_nodeconnection (id, node_id, server, opened_at, expires_at)
    SELECT %(connection)s, id, %(server)s, %(now)s, %(expires)s FROM seen WHERE %(in_database)s
    ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at
)
SELECT a.retired, a.banned, EXISTS (SELECT 1 FROM seen), {node_select_columns("a")}
FROM auth a, relaxed
"""


def node_session_open(*, token: str | None, connection_id: uuid.UUID) -> Node:
    """The node whose socket just opened with `token`, authenticated again and recorded: its token's
    last use, its last seen (now) and the socket's presence record (nodes.presence). Nothing is
    written when the token is refused.

    Raises ApplicationError "unauthenticated" (missing, malformed, unknown or revoked token, node
    retired) or "banned" (node or owner banned, including a ban that lands while this runs)."""
    if not token_is_well_formed(token):
        raise ApplicationError("unauthenticated", "A valid node token is required.", status=401)
    now = timezone.now()
    params = {
        "hash": token_hash(token),
        "now": now,
        "used_before": now - SEEN_WRITE_INTERVAL,
        "connection": connection_id,
        "server": presence.server_name(),
        "expires": now + timedelta(seconds=presence.expires_after_seconds()),
        "in_database": not settings.REDIS_URL,
    }
    # With Redis the presence record is written there, after the statement: a transaction around
    # both takes the statement's writes back if Redis fails (as the socket then fails to open).
    # Parameters bound by the server, not quoted into the SQL text by Django's cursor (the quoting was
    # most of this call's CPU after the statement itself).
    with transaction.atomic() if settings.REDIS_URL else nullcontext(), server_binding_cursor() as cursor:
        cursor.execute(_SESSION_OPEN_SQL, params)
        row = cursor.fetchone()
        if row is None or row[0]:
            raise ApplicationError("unauthenticated", "A valid node token is required.", status=401)
        if row[1] or not row[2]:
            raise ApplicationError("banned", "This node or its contributor is banned.", status=403)
        node = node_from_row(row[3:])
        node.last_seen_at = now  # the row as written (the statement read it before)
        if settings.REDIS_URL:
            presence.connection_open(node_id=node.id, connection_id=connection_id, now=now)
    return node
