"""Which nodes have an open WebSocket: one record per connection, renewed by a heartbeat, expiring.

Why not a counter on the node (what this replaced): a counter is right only if every disconnect runs.
A consumer that crashed, or a server killed with sockets open, left it up for good, and the node
showed "online" forever. Here each socket is one record whose expiry its heartbeat pushes forward
(every heartbeat_seconds(), to now + expires_after_seconds()); a record nobody renews stops counting by
itself. A server process also forgets, when it starts, the records its previous run left (same
SAPO_SERVER_NAME), so after a restart the dead sockets' nodes are offline at once, not a minute later.

Storage: Redis when REDIS_URL is set (one sorted set `<SAPO_REDIS_PREFIX>:presence`, member
"<node id>|<server>|<connection id>", score = expiry as a Unix time), else the database
(nodes.NodeConnection rows). The functions are synchronous: the consumer calls them through
database_sync_to_async, pages and selectors directly.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from common.redis_client import redis_client
from nodes.models import NodeConnection


def heartbeat_seconds() -> int:
    """How often an open socket renews its record (settings.SAPO_PRESENCE_HEARTBEAT_SECONDS, 20 s)."""
    return max(1, int(settings.SAPO_PRESENCE_HEARTBEAT_SECONDS))


def expires_after_seconds() -> int:
    """How long a record counts without being renewed: three missed heartbeats."""
    return 3 * heartbeat_seconds()


def server_name() -> str:
    """This process's name in presence records (settings.SAPO_SERVER_NAME; "|" is the separator)."""
    return str(settings.SAPO_SERVER_NAME).replace("|", "_")[:100]


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


# ---------------------------------------------------------------------------- Redis


def _redis_key() -> str:
    return f"{settings.SAPO_REDIS_PREFIX}:presence"


def _member(node_id: int, connection_id: uuid.UUID) -> str:
    return f"{int(node_id)}|{server_name()}|{connection_id}"


# ---------------------------------------------------------------------------- API


def connection_open(*, node_id: int, connection_id: uuid.UUID, now: datetime | None = None) -> None:
    """Record an accepted socket (or renew it: the heartbeat calls this too)."""
    now = _now(now)
    expires = now + timedelta(seconds=expires_after_seconds())
    if settings.REDIS_URL:
        with redis_client().pipeline(transaction=False) as pipe:
            pipe.zadd(_redis_key(), {_member(node_id, connection_id): expires.timestamp()})
            pipe.zremrangebyscore(_redis_key(), "-inf", now.timestamp())  # records nobody renewed
            pipe.execute()
        return
    with transaction.atomic(), connection.cursor() as cursor:
        # A heartbeat lost in a database crash is renewed by the next one: no need to wait for the disk.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        NodeConnection.objects.update_or_create(
            id=connection_id, defaults={"node_id": node_id, "server": server_name(), "expires_at": expires}
        )
        NodeConnection.objects.filter(expires_at__lt=now).delete()


def connection_close(*, node_id: int, connection_id: uuid.UUID) -> None:
    """Forget a socket that closed."""
    if settings.REDIS_URL:
        redis_client().zrem(_redis_key(), _member(node_id, connection_id))
        return
    NodeConnection.objects.filter(id=connection_id).delete()


def presence_server_start() -> int:
    """Forget the records this server's previous run left (it was killed or crashed with sockets
    open); the server calls this once when it starts serving. Returns how many were forgotten."""
    name = server_name()
    if settings.REDIS_URL:
        client = redis_client()
        mine = [m for m in client.zrange(_redis_key(), 0, -1) if m.decode().split("|")[1:2] == [name]]
        return client.zrem(_redis_key(), *mine) if mine else 0
    deleted, _ = NodeConnection.objects.filter(server=name).delete()
    return deleted


def connection_counts(node_ids: Iterable[int] | None = None, *, now: datetime | None = None) -> dict[int, int]:
    """Open, unexpired sockets per node (nodes without one are left out); all nodes when node_ids is None."""
    now = _now(now)
    wanted = None if node_ids is None else {int(i) for i in node_ids}
    if wanted is not None and not wanted:
        return {}
    if settings.REDIS_URL:
        members = redis_client().zrangebyscore(_redis_key(), f"({now.timestamp()}", "+inf")
        counts = Counter(int(m.split(b"|", 1)[0]) for m in members)
        return {n: c for n, c in counts.items() if wanted is None or n in wanted}
    rows = NodeConnection.objects.filter(expires_at__gt=now)
    if wanted is not None:
        rows = rows.filter(node_id__in=wanted)
    return dict(rows.values("node_id").annotate(n=Count("id")).values_list("node_id", "n"))


def connected_node_ids(node_ids: Iterable[int] | None = None, *, now: datetime | None = None) -> set[int]:
    """The nodes (of node_ids, or all) with at least one open, unexpired socket."""
    return set(connection_counts(node_ids, now=now))
