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

`refuse_bodies_early`: Twisted, under daphne, reads a request's whole body (into memory, or a temporary
file past 100 KB) before daphne hands the request to the application, whatever its size: a refusal by
the view comes after the bytes are on the server's disk. A request that `check` refuses on its
headers (an upload's announced length) is answered as soon as they are in, and its connection closed
without reading the body.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from http import HTTPStatus

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


#: What `refuse_bodies_early` is given: (method, path, headers by lower-case name) -> (status, JSON
#: body) of the answer, or None to read the request as usual. Content-Length is left out when the body
#: has no announced length (chunked).
BodyCheck = Callable[[str, str, Mapping[str, str]], "tuple[int, bytes] | None"]


class _Discard:
    """The refused request's content: whatever of the body already arrived with its headers."""

    closed = False

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args: int) -> int:
        return 0

    def read(self, *args: int) -> bytes:
        return b""

    def close(self) -> None:
        self.closed = True


def refuse_bodies_early(check: BodyCheck) -> None:
    """Answer a request that `check` refuses once its headers are in, before any of its body is read,
    and close its connection; daphne never sees it."""
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest.gotLength, "checks_early", False):
        WebRequest.gotLength.check = check
        return
    got_length, process = WebRequest.gotLength, WebRequest.process

    @functools.wraps(got_length)
    def gotLength(self, length: int | None) -> None:  # noqa: N802 - Twisted's name
        channel = self.channel
        command, uri = getattr(channel, "_command", b""), getattr(channel, "_path", b"")
        headers = {
            name.lower().decode("latin-1"): values[0].decode("latin-1")
            for name, values in self.requestHeaders.getAllRawHeaders()
        }
        if length is None:
            headers.pop("content-length", None)
        path = uri.split(b"?", 1)[0].decode("latin-1")
        answer = gotLength.check(command.decode("latin-1"), path, headers)
        if answer is None:
            return got_length(self, length)
        status, body = answer
        self.content, self.refused_early = _Discard(), True
        self.requestHeaders.removeHeader(b"Expect")  # no "100 Continue" after the answer
        phrase = HTTPStatus(status).phrase.encode()
        channel.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, phrase, len(body), body)
        )
        channel.loseConnection()  # stops reading: the body stays with the client

    gotLength.checks_early = True
    gotLength.check = check

    @functools.wraps(process)
    def process_unless_refused(self):
        if getattr(self, "refused_early", False):
            return None
        return process(self)

    WebRequest.gotLength = gotLength
    WebRequest.process = process_unless_refused


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
    from daphne.http_protocol import WebRequest
    from twisted.web.http import HTTPChannel

    if not {"gotLength", "requestHeaders"} <= names_used(HTTPChannel.allHeadersReceived):
        found.append(
            "Twisted's HTTPChannel.allHeadersReceived no longer calls the request's gotLength: "
            "an upload's body is read before its length is checked"
        )
    if not {"_command", "_path"} <= names_used(HTTPChannel.lineReceived):
        found.append("Twisted's HTTPChannel no longer keeps the request line as _command and _path")
    if "content" not in names_used(WebRequest.process):
        found.append("daphne's WebRequest.process no longer reads the request's content")
    return found
