"""Which nodes have an open WebSocket: one record per connection, renewed by a heartbeat, expiring.

Why not a counter on the node (what this replaced): a counter is right only if every disconnect runs.
A consumer that crashed, or a server killed with sockets open, left it up for good, and the node
showed "online" forever. Here each socket is one record whose expiry its heartbeat pushes forward
(every heartbeat_seconds(), to now + expires_after_seconds()); a record nobody renews stops counting by
itself. A server process also forgets, when it starts, the records its previous run left (same
SAPO_SERVER_NAME), so after a restart the dead sockets' nodes are offline at once, not a minute later.

The heartbeat is one per server process, not one per socket (`SocketBook`): every heartbeat_seconds()
it renews the records of all the process's open sockets in one Redis pipeline or one upsert, and
every SEEN_EVERY_SECONDS it writes the nodes that sent frames since (Node.last_seen_at) in one UPDATE.
A frame therefore costs no database or Redis round trip for bookkeeping (docs/benchmarks.md, "Sockets").

Each record carries the swarm its socket is in once its hello named one (`SocketBook.joined`, written
with the next beat), so a swarm's nodes online are read from presence (`connected_filter(scope=Scope.swarm(id))`).

Storage: Redis when REDIS_URL is set (one sorted set `<SAPO_REDIS_PREFIX>:presence`, member
"<node id>|<server>|<connection id>", score = expiry as a Unix time, and the same members in one
sorted set per swarm, `<SAPO_REDIS_PREFIX>:presence:swarm:<swarm id>`), else the database
(nodes.NodeConnection rows, with their swarm_id). The functions are synchronous: the consumer calls them through
common.db.db_call, pages and selectors directly.

Listings ask once for all their nodes, whatever their length: `with_connected` on the node queryset,
then `connected_among` on the rows. In the database the answer rides in the nodes' own query (an
EXISTS on their records), so a page costs the same queries with or without Redis; with Redis it is
one call for the whole listing. `connected_filter` does the same for a count or a filter on nodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from common import outage
from common.db import bookkeeping_transaction, db_call
from common.loops import per_loop
from common.redis_client import redis_client
from nodes.models import Node, NodeConnection
from nodes.services import nodes_mark_seen, nodes_record_hellos, nodes_record_statuses
from swarms.scope import SITE, Scope

logger = logging.getLogger(__name__)


def heartbeat_seconds() -> int:
    """How often an open socket renews its record (settings.SAPO_PRESENCE_HEARTBEAT_SECONDS, 20 s)."""
    return max(1, int(settings.SAPO_PRESENCE_HEARTBEAT_SECONDS))


def expires_after_seconds() -> int:
    """How long a record counts without being renewed: three missed heartbeats."""
    return 3 * heartbeat_seconds()


#: How often the nodes that sent frames are written as seen (nodes.services.SEEN_WRITE_INTERVAL).
SEEN_EVERY_SECONDS = 10


def server_name() -> str:
    """This process's name in presence records (settings.SAPO_SERVER_NAME; "|" is the separator)."""
    return str(settings.SAPO_SERVER_NAME).replace("|", "_")[:100]


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


# ---------------------------------------------------------------------------- Redis


def _redis_key() -> str:
    """The sorted set of every record."""
    return f"{settings.SAPO_REDIS_PREFIX}:presence"


def _swarm_key(swarm_id: int) -> str:
    """The sorted set of the records of one swarm's sockets."""
    return f"{settings.SAPO_REDIS_PREFIX}:presence:swarm:{int(swarm_id)}"


def _scope_key(scope: Scope) -> str:
    return _redis_key() if scope.is_site else _swarm_key(scope.swarm_id)


def _member(node_id: int, connection_id: uuid.UUID) -> str:
    return f"{int(node_id)}|{server_name()}|{connection_id}"


# ---------------------------------------------------------------------------- API


def connection_close(*, node_id: int, connection_id: uuid.UUID, swarm_id: int | None = None) -> None:
    """Forget a socket that closed (`swarm_id`: the swarm it was in, if any)."""
    if settings.REDIS_URL:
        if outage.REDIS.skip():  # known down: the record expires by itself (expires_after_seconds())
            return
        member = _member(node_id, connection_id)
        if swarm_id is None:
            redis_client().zrem(_redis_key(), member)
            return
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.zrem(_redis_key(), member)
            pipe.zrem(_swarm_key(swarm_id), member)
            pipe.execute()
        return
    # Raw SQL: the ORM's delete() collects related rows first, several times this statement's CPU
    # (docs/benchmarks.md, "Sockets"); nothing refers to a NodeConnection. Like the record's writes,
    # the commit does not wait for the disk (set_config(..., true): this statement's transaction).
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM nodes_nodeconnection USING (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed"
            " WHERE id = %s",
            [connection_id],
        )


def connections_renew(
    *, connections: dict[uuid.UUID, int], swarms: dict[uuid.UUID, int] | None = None, now: datetime | None = None
) -> None:
    """Renew the records of these sockets (connection id -> node id) all at once: the heartbeat. A
    socket in `swarms` (connection id -> swarm id) is recorded in that swarm.

    A socket that closes while its renewal is on the way may get its record back; it then expires
    after expires_after_seconds() like a crashed server's (renewing only existing records would instead
    lose a record for good if Redis forgot it). A socket's record in a swarm it left (a socket whose
    first frame came before its hello) is no longer renewed and expires the same way."""
    if not connections:
        return
    now = _now(now)
    swarms = swarms or {}
    expires = now + timedelta(seconds=expires_after_seconds())
    if settings.REDIS_URL:
        by_swarm: dict[int, dict[str, float]] = {}
        for c, n in connections.items():
            if c in swarms:
                by_swarm.setdefault(swarms[c], {})[_member(n, c)] = expires.timestamp()
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.zadd(_redis_key(), {_member(n, c): expires.timestamp() for c, n in connections.items()})
            pipe.zremrangebyscore(_redis_key(), "-inf", now.timestamp())
            for swarm_id, members in by_swarm.items():
                pipe.zadd(_swarm_key(swarm_id), members)
                pipe.zremrangebyscore(_swarm_key(swarm_id), "-inf", now.timestamp())
            pipe.execute()
        return
    server = server_name()
    with bookkeeping_transaction():
        NodeConnection.objects.bulk_create(
            [
                NodeConnection(id=c, node_id=n, server=server, expires_at=expires, swarm_id=swarms.get(c))
                for c, n in connections.items()
            ],
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=["expires_at", "swarm_id"],
        )
        NodeConnection.objects.filter(expires_at__lt=now).delete()


def presence_server_start() -> int:
    """Forget the records this server's previous run left (it was killed or crashed with sockets
    open); the server calls this once when it starts serving. Returns how many were forgotten."""
    name = server_name()
    if settings.REDIS_URL:
        client = redis_client()
        mine = [m for m in client.zrange(_redis_key(), 0, -1) if m.decode().split("|")[1:2] == [name]]
        if mine:
            for key in client.scan_iter(match=f"{settings.SAPO_REDIS_PREFIX}:presence:swarm:*"):
                client.zrem(key, *mine)
        return client.zrem(_redis_key(), *mine) if mine else 0
    deleted, _ = NodeConnection.objects.filter(server=name).delete()
    return deleted


class PresenceUnknown(Exception):
    """Redis, which holds the records, did not answer: who is connected is unknown (not "nobody")."""


def connection_counts(
    node_ids: Iterable[int] | None = None, *, now: datetime | None = None, scope: Scope = SITE
) -> dict[int, int]:
    """Open, unexpired sockets per node (nodes without one are left out); all nodes when node_ids is None;
    the sockets of the whole site or of one swarm (`scope`). Raises PresenceUnknown when Redis does not
    answer."""
    Scope.check(scope)
    now = _now(now)
    wanted = None if node_ids is None else {int(i) for i in node_ids}
    if wanted is not None and not wanted:
        return {}
    if settings.REDIS_URL:
        if outage.REDIS.skip():
            raise PresenceUnknown
        try:
            members = redis_client().zrangebyscore(_scope_key(scope), f"({now.timestamp()}", "+inf")
        except RedisError as exc:
            outage.REDIS.failed(exc)
            raise PresenceUnknown from exc
        outage.REDIS.answered()
        counts = Counter(int(m.split(b"|", 1)[0]) for m in members)
        return {n: c for n, c in counts.items() if wanted is None or n in wanted}
    rows = scope.rows(NodeConnection.objects.filter(expires_at__gt=now))
    if wanted is not None:
        rows = rows.filter(node_id__in=wanted)
    return dict(rows.values("node_id").annotate(n=Count("id")).values_list("node_id", "n"))


def connected_node_ids(
    node_ids: Iterable[int] | None = None, *, now: datetime | None = None, scope: Scope = SITE
) -> set[int]:
    """The nodes (of node_ids, or all) with at least one open, unexpired socket in `scope`."""
    return set(connection_counts(node_ids, now=now, scope=scope))


# The attribute with_connected annotates (database presence only).
_CONNECTED = "presence_connected"


def _connected_exists(now: datetime, scope: Scope = SITE) -> Exists:
    return Exists(scope.rows(NodeConnection.objects.filter(node_id=OuterRef("pk"), expires_at__gt=now)))


def with_connected(nodes: QuerySet[Node], *, now: datetime | None = None) -> QuerySet[Node]:
    """`nodes`, each read with whether it has an open socket, for `connected_among`: in the database, an
    EXISTS in the nodes' own query (no query of its own); with Redis, unchanged (the records are not
    in the database: connected_among asks Redis once for the listing)."""
    if settings.REDIS_URL:
        return nodes
    return nodes.annotate(**{_CONNECTED: _connected_exists(_now(now))})


def connected_among(nodes: Iterable[Node], *, now: datetime | None = None) -> set[int] | None:
    """The ids of `nodes` with an open, unexpired socket, asked once for all of them. Nodes read through
    `with_connected` answer from their rows, as of when they were read (no query); otherwise one Redis
    call or one query. None when it is unknown (Redis does not answer): statuses are then "unknown"."""
    nodes = list(nodes)
    if not settings.REDIS_URL and all(hasattr(node, _CONNECTED) for node in nodes):
        return {node.id for node in nodes if getattr(node, _CONNECTED)}
    try:
        return connected_node_ids([node.id for node in nodes], now=now)
    except PresenceUnknown:
        return None


def is_connected(connected: set[int] | None, node_id: int) -> bool | None:
    """Whether `node_id` is among `connected` (connected_among's answer); None when that is unknown."""
    return None if connected is None else node_id in connected


def connected_filter(*, now: datetime | None = None, scope: Scope) -> Q:
    """A filter on nodes: those with an open, unexpired socket in `scope`. In the database an EXISTS
    inside the filtering query; with Redis the ids it holds (one call; PresenceUnknown when it does
    not answer)."""
    Scope.check(scope)
    now = _now(now)
    if settings.REDIS_URL:
        return Q(id__in=connected_node_ids(now=now, scope=scope))
    return Q(_connected_exists(now, scope))


# ---------------------------------------------------------------------------- this process's sockets


class SocketBook:
    """The open sockets of one event loop (a server process has one) and the nodes that sent frames
    since the last write. One task renews and writes them all (see the module's docstring); it runs
    while the book holds a socket.

    The consumer calls `opened` once the socket's record is written (nodes.sessions), `joined` when
    it learns the socket's swarm, `seen` for each frame, and `closed` before it removes the record
    (connection_close)."""

    def __init__(self) -> None:
        self.sockets: dict[uuid.UUID, int] = {}
        self.swarms: dict[uuid.UUID, int] = {}  # connection id -> its swarm, once known
        self.moved: set[uuid.UUID] = set()  # sockets whose swarm is not written yet
        self.seen_nodes: set[int] = set()
        self.hellos: dict[int, dict[str, str]] = {}  # node id -> what it said (nodes.services.node_hello_fields)
        self.statuses: dict[int, dict[str, object]] = {}  # node id -> its last status (node_status_fields)
        self.task: asyncio.Task | None = None

    def opened(self, *, node_id: int, connection_id: uuid.UUID) -> None:
        self.sockets[connection_id] = node_id
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def joined(self, connection_id: uuid.UUID, swarm_id: int) -> None:
        """The socket is in this swarm (its hello named it): its record says so from the next beat, within
        SEEN_EVERY_SECONDS."""
        if connection_id in self.sockets and self.swarms.get(connection_id) != swarm_id:
            self.swarms[connection_id] = swarm_id
            self.moved.add(connection_id)

    def seen(self, node_id: int) -> None:
        self.seen_nodes.add(node_id)

    def said(self, node_id: int, fields: dict[str, str]) -> None:
        """The node said this in `hello` (and it differs from what is stored): written with the next
        beat, within SEEN_EVERY_SECONDS."""
        self.hellos[node_id] = fields

    def reported(self, node_id: int, fields: dict[str, object]) -> None:
        """The node said this in `status`: written with the next beat (the last one a node said wins)."""
        self.statuses[node_id] = fields

    def closed(self, connection_id: uuid.UUID) -> None:
        self.sockets.pop(connection_id, None)
        self.swarms.pop(connection_id, None)
        self.moved.discard(connection_id)
        if not self.sockets and self.task is not None:
            self.task.cancel()  # nothing left to renew (frames of the last 10 s stay unwritten)
            self.task = None
            if self.hellos or self.statuses:  # but what the nodes said is kept: one last write
                asyncio.get_running_loop().create_task(self.beat(renew=False))

    async def _run(self) -> None:
        renewed = time.monotonic()
        while self.sockets:
            beat = heartbeat_seconds()
            await asyncio.sleep(min(SEEN_EVERY_SECONDS, beat))  # a short heartbeat (tests) wakes more often
            renew = time.monotonic() - renewed >= beat - min(1, beat / 2)
            if renew:
                renewed = time.monotonic()
            await self.beat(renew=renew)

    async def beat(self, *, renew: bool) -> None:
        """Write the nodes seen, the hellos and statuses said and the swarms joined since the last beat and, with
        `renew`, renew every socket's record.
        A failure is logged and tried again next beat (a record lasts three heartbeats)."""
        seen, self.seen_nodes = self.seen_nodes, set()
        hellos, self.hellos = self.hellos, {}
        statuses, self.statuses = self.statuses, {}
        moved, self.moved = self.moved, set()
        if hellos:
            try:
                await db_call(nodes_record_hellos)(hellos=hellos)
            except Exception:
                logger.exception("recording %d nodes' hellos failed", len(hellos))
        if statuses:
            try:
                await db_call(nodes_record_statuses)(statuses=statuses)
            except Exception:
                logger.exception("recording %d nodes' statuses failed", len(statuses))
        if seen:
            try:
                await db_call(nodes_mark_seen)(node_ids=seen)
            except Exception:
                logger.exception("recording %d nodes as seen failed", len(seen))
        renewed = dict(self.sockets) if renew else {c: self.sockets[c] for c in moved if c in self.sockets}
        if renewed:
            try:
                await db_call(connections_renew)(connections=renewed, swarms=dict(self.swarms))
            except Exception as exc:
                self.moved |= moved & set(self.sockets)  # their swarm is written with a later beat
                if not outage.dependency_failed(exc):
                    logger.exception("presence heartbeat of %d sockets failed", len(renewed))


_books = per_loop(SocketBook)


def socket_book() -> SocketBook:
    """The running event loop's book (each loop renews its own sockets: tests run several loops)."""
    return _books()
