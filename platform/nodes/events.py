"""Telling a node's open WebSockets to close, after the transaction that caused it commits.

The pool's NodeConsumer joins `node_group_name(node.id)` when it accepts a socket and handles the
message type "node.disconnect" (method `node_disconnect(self, event)`) by closing with
`event["code"]`: 4401 when the node's tokens were revoked or the node retired, 4403 on a ban.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

CLOSE_UNAUTHENTICATED = 4401
CLOSE_BANNED = 4403


def node_group_name(node_id: int) -> str:
    return f"node.{node_id}"


def node_disconnect_on_commit(*, node_id: int, code: int, reason: str) -> None:
    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(
                node_group_name(node_id), {"type": "node.disconnect", "code": code, "reason": reason}
            )

    transaction.on_commit(send)
