"""daphne's WebSocket protocol class: the protocol's frame limit, and a text message's UTF-8 checked once.

`follow_frame_limit`: daphne hands autobahn a message-size limit of its own (1 MiB unless
`--websocket-max-message-size` or DAPHNE_WEBSOCKET_MAX_MESSAGE_SIZE says otherwise), and autobahn
fails a larger message by dropping the TCP connection (its `failByDrop` default): with
SAPO_MAX_FRAME_BYTES raised, frames the pool would accept vanished without a close code. Every way the
site is served (runserver, the `daphne` command of the Dockerfile, compose and `sapo_local`, the test
servers) imports config.asgi, which calls it. autobahn copies an option from its factory onto a new
connection only when the protocol class does not define it, so the class attributes set here win
over whatever daphne was told.

`validate_utf8_once`: autobahn checks a text message's UTF-8 in Python, then daphne decodes it, which
checks it again in C at a fraction of the cost: the first check is off, and a decode that fails
closes with autobahn's code for it (1007).
"""

from __future__ import annotations

import functools

from common.library_patches._inspect import names_used

#: The autobahn options set on daphne's protocol class (autobahn's CONFIG_ATTRS names).
_OPTIONS = ("maxMessagePayloadSize", "maxFramePayloadSize", "failByDrop", "utf8validateIncoming")


def follow_frame_limit(max_bytes: int) -> None:
    """Accept WebSocket messages up to `max_bytes` (Limits.websocket_max_bytes); close larger ones
    with 1009."""
    from daphne.ws_protocol import WebSocketProtocol

    WebSocketProtocol.maxMessagePayloadSize = max_bytes
    WebSocketProtocol.maxFramePayloadSize = max_bytes
    WebSocketProtocol.failByDrop = False  # a close frame with 1009 (message too big), not a bare TCP drop


def validate_utf8_once() -> None:
    """A text message's UTF-8 is checked once, by daphne's `payload.decode("utf8")`, not first by
    autobahn's validator too, which costs far more than the decode. A message that is not UTF-8 fails
    the connection with 1007 (invalid payload), as autobahn's check did; the consumer never sees it."""
    from daphne.ws_protocol import WebSocketProtocol

    if getattr(WebSocketProtocol.onMessage, "decodes_once", False):
        return
    on_message = WebSocketProtocol.onMessage

    @functools.wraps(on_message)
    def onMessage(self, payload: bytes, isBinary: bool) -> None:  # noqa: N802, N803 - autobahn's names
        try:
            on_message(self, payload, isBinary)
        except UnicodeDecodeError as exc:  # raised before daphne queues anything
            self._invalid_payload(f"invalid UTF-8 in a text message at octet {exc.start}")

    onMessage.decodes_once = True
    WebSocketProtocol.onMessage = onMessage
    WebSocketProtocol.utf8validateIncoming = False


def moved() -> list[str]:
    """What the two changes rely on that this daphne (or the autobahn under it) no longer has where
    they expect it."""
    from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
    from autobahn.websocket.protocol import WebSocketServerProtocol
    from daphne.ws_protocol import WebSocketProtocol

    found = []
    if not issubclass(WebSocketProtocol, WebSocketServerProtocol):
        found.append("daphne.ws_protocol.WebSocketProtocol is no longer autobahn's WebSocketServerProtocol")
    options = set(getattr(WebSocketServerProtocol, "CONFIG_ATTRS", ()))
    for name in _OPTIONS:
        if name not in options:
            found.append(f"autobahn's server protocol no longer has the option {name}: setting it does nothing")
    if not {"CONFIG_ATTRS", "hasattr"} <= names_used(AutobahnProtocol._connectionMade):
        found.append(
            "autobahn's _connectionMade no longer copies only the options its protocol class lacks: "
            "daphne's frame limit may win over the protocol's"
        )
    if not callable(getattr(AutobahnProtocol, "_invalid_payload", None)):
        found.append("autobahn's WebSocketProtocol._invalid_payload is gone: bad UTF-8 would not close with 1007")
    if not {"decode", "put_nowait"} <= names_used(WebSocketProtocol.onMessage):
        found.append(
            "daphne's WebSocketProtocol.onMessage no longer decodes a text message itself before "
            "queueing it: with autobahn's check off, bad UTF-8 would reach the consumer"
        )
    return found
