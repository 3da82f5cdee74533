"""Daphne's WebSocket layer, made to follow the protocol's frame limit (docs/protocol.md, "Limits").

daphne hands autobahn a message-size limit of its own (1 MiB unless `--websocket-max-message-size` or
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE says otherwise), and autobahn fails a larger message by dropping the
TCP connection (its `failByDrop` default): with SAPO_MAX_FRAME_BYTES raised, frames the pool would
accept vanished without a close code. Every way the site is served (runserver, the `daphne` command
of the Dockerfile, compose and `sapo_local`, the test servers) imports config.asgi, which calls
`follow_frame_limit`. autobahn copies an option from its factory onto a new connection only when the
protocol class does not define it, so the class attributes set here win over whatever daphne was told.
"""

from __future__ import annotations

from pool.limits import Limits


def follow_frame_limit(limits: Limits) -> None:
    """Accept WebSocket messages up to `limits.websocket_max_bytes`; close larger ones with 1009."""
    from daphne.ws_protocol import WebSocketProtocol

    size = limits.websocket_max_bytes
    WebSocketProtocol.maxMessagePayloadSize = size
    WebSocketProtocol.maxFramePayloadSize = size
    WebSocketProtocol.failByDrop = False  # a close frame with 1009 (message too big), not a bare TCP drop
