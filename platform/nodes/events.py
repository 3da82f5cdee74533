"""Telling a node's open WebSockets to close, after the transaction that caused it commits.

Every server process joins one channel-layer group, CLOSES_GROUP, once (pool.closes), and keeps a
registry of its open node sockets by node and by contributor. A close is one message to that group
(`close_event`): every process closes its own sockets of that node (4401 when the node's tokens were
revoked or the node retired, 4403 on a ban) or of every node of that contributor (4403, a ban).
One group per process, not two per socket (node and contributor): a socket's own groups would cost
two group_add per socket opened, two group_discard per socket closed and a task per socket renewing
them, which a crowd of sockets opening at once pays for (docs/benchmarks.md, "Sockets").
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sapo_node.protocol import CLOSE_BANNED, CLOSE_UNAUTHENTICATED

__all__ = ["CLOSES_GROUP", "CLOSE_BANNED", "CLOSE_UNAUTHENTICATED", "close_event"]

#: The channel-layer group every server process joins once (pool.closes).
CLOSES_GROUP = "node-closes"


def close_event(*, code: int, reason: str, node_id: int | None = None, contributor_id: int | None = None) -> dict:
    """The message that closes the open sockets of one node, or of every node of one contributor."""
    if (node_id is None) == (contributor_id is None):
        raise ValueError("a close names a node or a contributor")
    return {
        "type": "node.disconnect",
        "code": code,
        "reason": reason,
        "node_id": node_id,
        "contributor_id": contributor_id,
    }


def node_disconnect_on_commit(*, node_id: int, code: int, reason: str) -> None:
    """Close the node's open sockets with `code` once the current transaction commits."""
    _disconnect_on_commit(close_event(node_id=node_id, code=code, reason=reason))


def contributor_disconnect_on_commit(*, user_id: int, code: int, reason: str) -> None:
    """Close every open socket of every node of the contributor (one message, all server processes)."""
    _disconnect_on_commit(close_event(contributor_id=user_id, code=code, reason=reason))


def _disconnect_on_commit(event: dict) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(CLOSES_GROUP, event)

    transaction.on_commit(send)
