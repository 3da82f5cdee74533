"""Telling a node's open WebSockets to close, after the transaction that caused it commits.

The pool's NodeConsumer joins `node_group_name(node.id)` and `contributor_group_name(owner id)`
when it accepts a socket, and handles the message type "node.disconnect" (method
`node_disconnect(self, event)`) by closing with `event["code"]`: 4401 when the node's tokens were
revoked or the node retired, 4403 on a ban of the node or of its whole contributor.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from sapo_node.protocol import CLOSE_BANNED, CLOSE_UNAUTHENTICATED

__all__ = ["CLOSE_BANNED", "CLOSE_UNAUTHENTICATED", "contributor_group_name", "node_group_name"]


def node_group_name(node_id: int) -> str:
    return f"node.{node_id}"


def contributor_group_name(user_id: int) -> str:
    return f"contributor.{user_id}"


def node_disconnect_on_commit(*, node_id: int, code: int, reason: str) -> None:
    """Close the node's open sockets with `code` once the current transaction commits."""
    _disconnect_on_commit(node_group_name(node_id), code=code, reason=reason)


def contributor_disconnect_on_commit(*, user_id: int, code: int, reason: str) -> None:
    """Close every open socket of every node of the contributor (one message, all server processes)."""
    _disconnect_on_commit(contributor_group_name(user_id), code=code, reason=reason)


def _disconnect_on_commit(group: str, *, code: int, reason: str) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, {"type": "node.disconnect", "code": code, "reason": reason})

    transaction.on_commit(send)
