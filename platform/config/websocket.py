"""Daphne's WebSocket layer, made to follow the protocol's frame limit (docs/protocol.md, "Limits").

daphne hands autobahn a message-size limit of its own (1 MiB unless `--websocket-max-message-size` or
DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE says otherwise), and autobahn fails a larger message by dropping the
TCP connection (its `failByDrop` default): with SAPO_MAX_FRAME_BYTES raised, frames the pool would
accept vanished without a close code. Every way the site is served (runserver, the `daphne` command
of the Dockerfile, compose and `sapo_local`, the test servers) imports config.asgi, which calls
`follow_frame_limit`. autobahn copies an option from its factory onto a new connection only when the
protocol class does not define it, so the class attributes set here win over whatever daphne was told.

`format_debug_lazily` (also called by config.asgi): autobahn makes the text of its debug log lines
whether or not debug logging is on: it pretty-prints every new connection's options, and colours a
method's name, the peer and a length with click for every chunk received and every frame sent
(`hltype`, `hlval`: four `click.style` calls each time, and a lost connection's whole traceback as
text), a visible part of the server's CPU per socket. Here that text is made only if a log line
formats it (docs/benchmarks.md, "Sockets").

`validate_utf8_once` (also called by config.asgi): autobahn checks a text message's UTF-8 in Python,
then daphne decodes it, which checks it again in C at a fraction of the cost: the first check is off,
and a decode that fails closes with autobahn's code for it (1007).

`unmask_with_websockets` (also called by config.asgi): every frame a client sends is masked; autobahn
makes a new CFFI masker for each frame (an import, two allocations and a finaliser). The
`websockets` library's C `apply_mask` does the same XOR without them (docs/benchmarks.md, "Sockets").
"""

from __future__ import annotations

from collections.abc import Callable
from pprint import pformat
from typing import Any

from pool.limits import Limits

try:
    from websockets.speedups import apply_mask
except ImportError:  # a pure-Python websockets: autobahn's maskers stay
    apply_mask = None


def follow_frame_limit(limits: Limits) -> None:
    """Accept WebSocket messages up to `limits.websocket_max_bytes`; close larger ones with 1009."""
    from daphne.ws_protocol import WebSocketProtocol

    size = limits.websocket_max_bytes
    WebSocketProtocol.maxMessagePayloadSize = size
    WebSocketProtocol.maxFramePayloadSize = size
    WebSocketProtocol.failByDrop = False  # a close frame with 1009 (message too big), not a bare TCP drop


def validate_utf8_once() -> None:
    """A text message's UTF-8 is checked once, by daphne's `payload.decode("utf8")`, not first by
    autobahn's validator too, which costs far more than the decode. A message
    that is not UTF-8 fails the connection with 1007 (invalid payload), as autobahn's check did; the
    consumer never sees it."""
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol.onMessage, "decodes_once", False):
        return
    on_message = WebSocketProtocol.onMessage

    def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802, N803 - autobahn's names
        try:
            on_message(self, payload, isBinary)
        except UnicodeDecodeError as exc:  # raised before daphne queues anything
            self._invalid_payload(f"invalid UTF-8 in a text message at octet {exc.start}")

    onMessage.decodes_once = True
    WebSocketProtocol.onMessage = onMessage
    WebSocketProtocol.utf8validateIncoming = False


class _FormattedWhenLogged:
    """`make(*args)`, called when a log line formats it (never, with debug logging off)."""

    __slots__ = ("args", "make")

    def __init__(self, make: Callable[..., str], *args: Any) -> None:
        self.make, self.args = make, args

    def __format__(self, spec: str) -> str:
        return format(self.make(*self.args), spec)

    def __str__(self) -> str:
        return self.make(*self.args)

    __repr__ = __str__


def _pformat_for_debug_logs(value: Any, *args: Any, **kwargs: Any) -> Any:
    # The one list autobahn.websocket.protocol pretty-prints is the options of a new connection, for
    # `log.debug`; its other uses (dicts) are __str__ methods, which must return a real string.
    if isinstance(value, list) and not args and not kwargs:
        return _FormattedWhenLogged(pformat, value)
    return pformat(value, *args, **kwargs)


def _when_logged(make: Callable[..., str]) -> Callable[..., _FormattedWhenLogged]:
    def lazily(*args: Any) -> _FormattedWhenLogged:
        return _FormattedWhenLogged(make, *args)

    return lazily


def format_debug_lazily() -> None:
    """Make autobahn's debug text only when a log line uses it. The two modules that serve sockets
    use `hltype` and `hlval` only for the keyword arguments of `log.debug` (autobahn 26.10)."""
    from autobahn import util
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol

    protocol.pformat = _pformat_for_debug_logs
    for module in (protocol, twisted_websocket):
        module.hltype = _when_logged(util.hltype)
        module.hlval = _when_logged(util.hlval)


class _Unmasker:
    """autobahn's masker interface (`process` chunk after chunk of one frame, `pointer`, `reset`) on
    `websockets.speedups.apply_mask`."""

    __slots__ = ("_masks", "_offset")

    def __init__(self, mask: bytes) -> None:
        mask = bytes(mask)
        self._masks = [mask[k:] + mask[:k] for k in range(4)]  # the key rotated to each offset
        self._offset = 0

    def pointer(self) -> int:
        return self._offset

    def reset(self) -> None:
        self._offset = 0

    def process(self, data: bytes) -> bytes:
        mask = self._masks[self._offset & 3]
        self._offset += len(data)
        return apply_mask(data, mask)


def _unmasker(mask: bytes, length: int | None = None) -> _Unmasker:
    return _Unmasker(mask)


def unmask_with_websockets() -> None:
    """Mask and unmask WebSocket frames with `websockets`' C `apply_mask` (when its speedups are
    built: a wheel without them keeps autobahn's maskers)."""
    if apply_mask is None:
        return
    from autobahn.websocket import protocol

    protocol.create_xor_masker = _unmasker
