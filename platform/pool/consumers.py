"""The node WebSocket, `/ws/node/` (docs/protocol.md). Thin: authenticate, validate a frame with
pool.messages, call a service or selector through database_sync_to_async, send the reply.

Channel-layer groups joined per socket: `node.<node id>` (nodes.events.node_group_name) and
`contributor.<owner id>` (both named in nodes.events). Handlers: "node.ban" closes with 4403; "node.disconnect" closes with the
code it carries (sent by nodes.services when tokens are revoked or a node retires).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from common.errors import ApplicationError
from nodes.events import CLOSE_BANNED, CLOSE_UNAUTHENTICATED, contributor_group_name, node_group_name
from nodes.services import node_authenticate, node_mark_disconnected, node_mark_seen, node_record_hello
from pool import ratelimit
from pool.limits import current_catalogue, current_limits
from pool.messages import Hello, ProtocolError, Report, Sample, Share, parse_frame
from pool.payloads import rollout_to_protocol
from pool.selectors import rollout_sample
from pool.services import moderation_hooks, node_round_report, node_session_open, rollout_share

logger = logging.getLogger(__name__)

CLOSE_TOO_MANY_ERRORS = 4429
SEEN_EVERY_SECONDS = 10.0


def _bearer_token(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def _sample_payload(*, node: Any, n: int, window_seconds: int) -> list[dict[str, Any]]:
    return [rollout_to_protocol(r) for r in rollout_sample(node=node, n=n, window_seconds=window_seconds)]


class NodeConsumer(AsyncWebsocketConsumer):
    node = None
    joined: tuple[str, ...] = ()

    async def connect(self) -> None:
        # Accept first: a close code only reaches the client on an open WebSocket (a refused
        # handshake is a bare HTTP 403 without one).
        await self.accept()
        try:
            node = await database_sync_to_async(node_authenticate)(token=_bearer_token(self.scope))
        except ApplicationError as exc:
            await self.close(code=CLOSE_BANNED if exc.code == "banned" else CLOSE_UNAUTHENTICATED)
            return
        self.limits = current_limits()
        self.catalogue = current_catalogue()
        self.consecutive_errors = 0
        self.joined = (node_group_name(node.id), contributor_group_name(node.owner_id))
        for group in self.joined:
            await self.channel_layer.group_add(group, self.channel_name)
        # Checked again after joining the groups, so a ban made in between is not missed.
        if not await database_sync_to_async(node_session_open)(node=node):
            await self.close(code=CLOSE_BANNED)
            return
        hooks = moderation_hooks()
        self.rate_limit = self.limits.max_messages_per_minute
        if hooks:  # a node with low trust gets a smaller share of the limit
            self.rate_limit = await database_sync_to_async(hooks.node_message_quota)(
                node_id=node.id, base=self.rate_limit
            )
        self.node = node
        self.last_seen = time.monotonic()

    async def disconnect(self, code: int) -> None:
        for group in self.joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.node is not None:
            node, self.node = self.node, None
            await database_sync_to_async(node_mark_disconnected)(node=node)

    # Channel-layer events -------------------------------------------------------------------

    async def node_ban(self, event: dict[str, Any]) -> None:
        await self._shut(CLOSE_BANNED)

    async def node_disconnect(self, event: dict[str, Any]) -> None:
        await self._shut(int(event.get("code", CLOSE_UNAUTHENTICATED)))

    async def _shut(self, code: int) -> None:
        # Leave the groups and record the disconnection first: once the node sees the close, the
        # server is done with it.
        await self.disconnect(code)
        await self.close(code=code)

    # Frames ---------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.node is None:
            return
        try:
            if await ratelimit.hit(self.node.id, self.rate_limit):
                raise ProtocolError("rate_limited", f"more than {self.rate_limit} messages per minute")
            message = parse_frame(text_data if text_data is not None else bytes_data, self.limits)
        except ProtocolError as exc:
            await self._error(exc.code, exc.detail, exc.ref)
            return
        try:
            reply = await self._dispatch(message)
        except ApplicationError as exc:
            await self._error(exc.code, exc.message, message.ref)
            return
        except Exception:
            logger.exception("node %s: %s failed", self.node.id, type(message).__name__)
            await self._error("internal_error", "the server failed to handle this message", message.ref)
            return
        self.consecutive_errors = 0
        await self._send(reply, message.ref)
        if time.monotonic() - self.last_seen >= SEEN_EVERY_SECONDS and self.node is not None:
            self.last_seen = time.monotonic()
            await database_sync_to_async(node_mark_seen)(node=self.node)

    async def _dispatch(self, message: Hello | Share | Sample | Report) -> dict[str, Any]:
        node = self.node
        if isinstance(message, Share):
            # Not thread-sensitive: several sockets' shares verify and insert in parallel (each thread
            # has its own DB connection), so one socket's database wait overlaps another's verification.
            result = await database_sync_to_async(rollout_share, thread_sensitive=False)(
                node=node, rollouts=message.rollouts, catalogue=self.catalogue
            )
            return {"type": "ack", "for": "share", "accepted": result.accepted, "rejected": result.rejected}
        if isinstance(message, Sample):
            rollouts = await database_sync_to_async(_sample_payload)(
                node=node, n=message.n, window_seconds=self.limits.sample_window_seconds
            )
            return {"type": "samples", "rollouts": rollouts}
        if isinstance(message, Report):
            await database_sync_to_async(node_round_report)(node=node, report=message)
            return {"type": "ack", "for": "report", "round": message.round}
        await database_sync_to_async(node_record_hello)(
            node=node, client=message.client, model=message.model, hardware=message.hardware
        )
        return {
            "type": "welcome",
            "node_id": node.id,
            "node_name": node.name,
            "catalogue": self.catalogue.to_json(),
            "limits": self.limits.to_json(),
        }

    async def _send(self, payload: dict[str, Any], ref: str | None) -> None:
        payload["v"] = 1
        if ref is not None:
            payload["ref"] = ref
        await self.send(text_data=json.dumps(payload, separators=(",", ":")))

    async def _error(self, code: str, detail: str, ref: str | None) -> None:
        self.consecutive_errors += 1
        await self._send({"type": "error", "code": code, "detail": detail}, ref)
        if self.consecutive_errors >= self.limits.max_consecutive_errors:
            await self._shut(CLOSE_TOO_MANY_ERRORS)
