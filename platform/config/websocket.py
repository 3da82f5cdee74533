"""Daphne's WebSocket layer, made to follow the protocol's frame limit (docs/protocol.md, "Limits").

daphne hands autobahn a message-size limit of its own (1 MiB unless `--websocket-max-message-size` or
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE says otherwise), and autobahn fails a larger message by dropping the
TCP connection (its `failByDrop` default): with SAPO_MAX_FRAME_BYTES raised, frames the pool would
accept vanished without a close code. Every way the site is served (runserver, the `daphne` command
of the Dockerfile, compose and `sapo_local`, the test servers) imports config.asgi, which calls
`follow_frame_limit`. autobahn copies an option from its factory onto a new connection only when the
protocol class does not define it, so the class attributes set here win over whatever daphne was told.

`format_debug_lazily` (also called by config.asgi): autobahn pretty-prints every new connection's
options for a debug log line, whether or not debug logging is on: ~0.1 ms, 7% of the server's CPU per
socket opened (docs/benchmarks.md, "Sockets"). The text is now made only if a log line formats it.
"""

from __future__ import annotations

from pprint import pformat
from typing import Any

from pool.limits import Limits


def follow_frame_limit(limits: Limits) -> None:
    """Accept WebSocket messages up to `limits.websocket_max_bytes`; close larger ones with 1009."""
    from daphne.ws_protocol import WebSocketProtocol

    size = limits.websocket_max_bytes
    WebSocketProtocol.maxMessagePayloadSize = size
    WebSocketProtocol.maxFramePayloadSize = size
    WebSocketProtocol.failByDrop = False  # a close frame with 1009 (message too big), not a bare TCP drop


class _FormattedWhenLogged:
    """pformat(value), made when a log line formats it (never, with debug logging off)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        return format(pformat(self.value), spec)

    def __str__(self) -> str:
        return pformat(self.value)

    __repr__ = __str__


def _pformat_for_debug_logs(value: Any, *args: Any, **kwargs: Any) -> Any:
    # The one list autobahn.websocket.protocol pretty-prints is the options of a new connection, for
    # `log.debug`; its other uses (dicts) are __str__ methods, which must return a real string.
    if isinstance(value, list) and not args and not kwargs:
        return _FormattedWhenLogged(value)
    return pformat(value, *args, **kwargs)


def format_debug_lazily() -> None:
    """Make autobahn's per-connection debug text only when a log line uses it."""
    from autobahn.websocket import protocol

    protocol.pformat = _pformat_for_debug_logs
