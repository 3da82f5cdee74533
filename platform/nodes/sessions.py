"""Node sockets' sessions, opened in one statement: the bearer token checked again, the node's
standing (banned, retired), the token's last use, the node's last seen and the socket's presence
record, in one database round trip for all the sockets opening together (sockets.opening;
docs/benchmarks.md, "Sockets").

Raw SQL, not the ORM, on purpose: the socket opens under load all at once (a server restart brings
every node back within seconds), and Django building and sending the same reads and writes as seven
statements costs several times the CPU of this one, most of the one process's budget per socket.
The checks and the writes are one statement, so a node found banned or retired writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from psycopg import sql
from redis.exceptions import RedisError

from common import outage
from common.composed import rendered
from common.db import server_binding_cursor
from common.errors import ApplicationError
from nodes import presence
from nodes.models import Node
from nodes.services import SEEN_WRITE_INTERVAL, node_from_row, node_select_columns, token_hash, token_is_well_formed

# One statement in its own transaction (autocommit), whose commit does not wait for the disk: the
# writes are bookkeeping (common.db.bookkeeping_transaction says why; set_config(..., true) lasts for
# this statement's transaction, one round trip). It opens several sockets' sessions at once (`n`: each
# request's place; a token may come twice): the writes see the read's snapshot only through `seen`: a
# node's row is updated only while neither it nor its owner is banned (checked again on the locked
# row), and nothing else is written for a request unless its node was. The node rows are locked in id
# order first (`locked`), as every statement that updates several of them does: two such statements
# never wait on each other in a cycle.
_SESSIONS_OPEN_SQL = rendered(
    sql.SQL("""
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true)),
auth AS (
    SELECT r.n, r.connection, t.id AS token_id, n.retired_at IS NOT NULL AS retired,
           n.banned_at IS NOT NULL OR u.banned_at IS NOT NULL AS banned, {auth_columns}
    FROM unnest(%(hash)s::text[], %(connection)s::uuid[]) WITH ORDINALITY AS r(hash, connection, n)
    JOIN nodes_nodetoken t ON t.token_hash = r.hash AND t.revoked_at IS NULL
    JOIN nodes_node n ON n.id = t.node_id JOIN accounts_user u ON u.id = n.owner_id
),
locked AS (
    SELECT n.id FROM nodes_node n
    WHERE n.id IN (SELECT id FROM auth WHERE NOT retired AND NOT banned)
    ORDER BY n.id FOR NO KEY UPDATE
),
seen AS (
    UPDATE nodes_node n SET last_seen_at = %(now)s
    FROM accounts_user u
    WHERE n.id IN (SELECT id FROM locked) AND u.id = n.owner_id AND n.banned_at IS NULL AND u.banned_at IS NULL
    RETURNING n.id
),
used AS (
    UPDATE nodes_nodetoken t SET last_used_at = %(now)s
    WHERE t.id IN (SELECT token_id FROM auth WHERE id IN (SELECT id FROM seen))
      AND (t.last_used_at IS NULL OR t.last_used_at < %(used_before)s)
),
present AS (
    INSERT INTO nodes_nodeconnection (id, node_id, server, opened_at, expires_at)
    SELECT connection, id, %(server)s, %(now)s, %(expires)s FROM auth
    WHERE id IN (SELECT id FROM seen) AND %(in_database)s
    ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at
)
SELECT a.n, a.retired, a.banned, a.id IN (SELECT id FROM seen), {answer_columns}
FROM auth a, relaxed
""").format(auth_columns=node_select_columns("n"), answer_columns=node_select_columns("a"))
)


def _unauthenticated() -> ApplicationError:
    return ApplicationError("unauthenticated", "A valid node token is required.", status=401)


def nodes_sessions_open(*, requests: Sequence[tuple[str | None, uuid.UUID]]) -> list[Node | ApplicationError]:
    """The nodes whose sockets just opened, authenticated again and recorded: each token's last use,
    each node's last seen (now) and each socket's presence record (nodes.presence), for several sockets
    at once in one statement (one round trip however many sockets open together: a server restart
    brings every node back within seconds). `requests` are (token, connection id) pairs; each gets, in
    order, its node or its refusal, an ApplicationError returned, not raised ("unauthenticated":
    missing, malformed, unknown or revoked token, node retired; "banned": node or owner banned,
    including a ban that lands while this runs). Nothing is written for a refused request."""
    answers: list[Node | ApplicationError] = [_unauthenticated()] * len(requests)
    asked = [
        (i, token_hash(token), connection_id)
        for i, (token, connection_id) in enumerate(requests)
        if token_is_well_formed(token)
    ]
    if not asked:
        return answers
    now = timezone.now()
    params = {
        "hash": [h for _, h, _ in asked],
        "connection": [c for _, _, c in asked],
        "now": now,
        "used_before": now - SEEN_WRITE_INTERVAL,
        "server": presence.server_name(),
        "expires": now + timedelta(seconds=presence.expires_after_seconds()),
        "in_database": not settings.REDIS_URL,
    }
    # With Redis the presence records are written there, after the statement. While Redis is down the
    # sockets open without their records (common.outage): presence is unknown meanwhile anyway, and the
    # process's heartbeat (presence.SocketBook) writes them once Redis answers.
    # Parameters bound by the server, not quoted into the SQL text by Django's cursor (the quoting was
    # most of this call's CPU after the statement itself).
    with server_binding_cursor() as cursor:
        cursor.execute(_SESSIONS_OPEN_SQL, params)
        opened: dict[uuid.UUID, int] = {}
        for n, retired, banned, seen, *columns in cursor.fetchall():
            i = asked[n - 1][0]
            if retired:
                continue  # unauthenticated, as an unknown token
            if banned or not seen:
                answers[i] = ApplicationError("banned", "This node or its contributor is banned.", status=403)
                continue
            node = node_from_row(columns)
            node.last_seen_at = now  # the row as written (the statement read it before)
            answers[i] = node
            opened[requests[i][1]] = node.id
        if settings.REDIS_URL and not outage.REDIS.skip():
            try:
                presence.connections_renew(connections=opened, now=now)
            except RedisError as exc:  # the sockets open unseen; the heartbeat writes them when Redis answers
                outage.REDIS.failed(exc)
            else:
                outage.REDIS.answered()
    return answers
