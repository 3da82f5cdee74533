"""Orders open node sockets must obey: closes (a token revoked, a ban), a node paused or resumed by its
owner, and swarms' changes.

An order is a row of nodes.models.SocketOrder, written in the transaction that makes the change
(`socket_order`): it commits with the change or not at all, so a process that stops after the change,
a Redis that is down or comes back empty, or a message sent to a group nobody has joined yet loses
nothing. Every server process delivers each order to its own sockets once (sockets.closes), by two paths:

- at once: once the transaction commits, the order is one message to the channel-layer group
  CLOSES_GROUP, which every process joins once (a socket closes within milliseconds);
- for certain: every process reads the orders made in the last ORDERS_LOOKBACK_SECONDS from the
  database every settings.SAPO_SOCKET_ORDERS_SECONDS (`socket_orders_recent`), so an order the first
  path lost reaches its sockets that many seconds later, whatever Redis does.

A close names a node (4401 when the node's tokens were revoked, 4403 on a ban) or a contributor (4403,
every node of theirs). One group per process, not two per socket (node and contributor): a socket's own
groups would cost two group_add per socket opened, two group_discard per socket closed and a task per
socket renewing them, which a crowd of sockets opening at once pays for (docs/benchmarks.md, "Sockets").
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.db.models.functions import Now

from common import outage
from nodes.models import SocketOrder
from sapo_node.protocol import CLOSE_BANNED, CLOSE_UNAUTHENTICATED

__all__ = ["CLOSES_GROUP", "CLOSE_BANNED", "CLOSE_UNAUTHENTICATED", "NODE_PAUSED", "close_event", "socket_order"]

logger = logging.getLogger(__name__)

#: The channel-layer group every server process joins once (sockets.closes).
CLOSES_GROUP = "node-closes"
#: Seconds between two joins of CLOSES_GROUP by each process (sockets.closes): after Redis lost its data,
#: the longest a process is out of the group (the database's path delivers meanwhile).
CLOSES_REJOIN_SECONDS = 5.0
#: A close's type on the channel layer (a message between server processes, not a node protocol frame).
CLOSE_EVENT = "node.disconnect"
#: A node's pause's type on the channel layer: {"node_id", "paused": bool}; its sockets send it a `pause`.
NODE_PAUSED = "node.paused"
#: How far back each read of the orders looks: longer than any transaction that writes one stays open
#: between its write and its commit (the row's time is the transaction's start).
ORDERS_LOOKBACK_SECONDS = 600.0
#: Orders older than this are deleted (a socket opened since then was authenticated after them).
ORDERS_KEPT = timedelta(days=1)
#: The key an order's id travels under in its message (each process delivers an order once).
ORDER_KEY = "order"


def close_event(*, code: int, reason: str, node_id: int | None = None, contributor_id: int | None = None) -> dict:
    """The message that closes the open sockets of one node, or of every node of one contributor."""
    if (node_id is None) == (contributor_id is None):
        raise ValueError("a close names a node or a contributor")
    return {
        "type": CLOSE_EVENT,
        "code": code,
        "reason": reason,
        "node_id": node_id,
        "contributor_id": contributor_id,
    }


def socket_order(event: dict[str, Any]) -> SocketOrder:
    """Record `event` for every server process's sockets, in the caller's transaction, and send it on the
    channel layer once that commits. Raises RuntimeError outside a transaction: the order must commit
    with the change it carries out, or a crash between the two would lose it."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a socket order is written in the transaction that makes its change")
    order = SocketOrder.objects.create(event=event)
    message = {**event, ORDER_KEY: order.id}
    transaction.on_commit(lambda: _send(message))
    return order


def node_disconnect_on_commit(*, node_id: int, code: int, reason: str) -> None:
    """Close the node's open sockets with `code` once the current transaction commits."""
    socket_order(close_event(node_id=node_id, code=code, reason=reason))


def contributor_disconnect_on_commit(*, user_id: int, code: int, reason: str) -> None:
    """Close every open socket of every node of the contributor (one order, all server processes)."""
    socket_order(close_event(contributor_id=user_id, code=code, reason=reason))


def node_pause_on_commit(*, node_id: int, paused: bool) -> None:
    """Tell the node's open sockets it is paused (or resumed) once the current transaction commits."""
    socket_order({"type": NODE_PAUSED, "node_id": node_id, "paused": paused})


def _send(message: dict[str, Any]) -> None:
    """The fast path; a failure is the database path's to make up for, never the committed change's."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(CLOSES_GROUP, message)
    except Exception as exc:
        if not outage.dependency_failed(exc):
            logger.exception(
                "sending a socket order on the channel layer failed; the processes read it from the database"
            )


def socket_orders_recent() -> list[dict[str, Any]]:
    """The orders made in the last ORDERS_LOOKBACK_SECONDS, oldest first, each its message with its id."""
    rows = SocketOrder.objects.filter(created_at__gte=Now() - timedelta(seconds=ORDERS_LOOKBACK_SECONDS))
    return [{**event, ORDER_KEY: id_} for id_, event in rows.order_by("id").values_list("id", "event")]


def socket_orders_prune() -> int:
    """Delete the orders older than ORDERS_KEPT. Returns how many."""
    deleted, _ = SocketOrder.objects.filter(created_at__lt=Now() - ORDERS_KEPT).delete()
    return deleted
