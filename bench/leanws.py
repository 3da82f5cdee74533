"""A minimal WebSocket client (RFC 6455) for benchmarks that open thousands of sockets from one process
on the cores the server needs: `bench/sockets.py --client lean`.

It does what a client must and no more: the opening handshake (a random key, the server's
Sec-WebSocket-Accept checked, anything but 101 refused), text messages sent masked with a fresh key
each (websockets' C mask), the server's frames read (unmasked, fragments joined, a ping answered with
its pong, a close answered and the socket shut). No extensions, no subprotocols, no TLS. The node
client itself uses the `websockets` library (sapo_node.transport.websocket); this is only cheaper
per socket: the clients' CPU, not the server's, is what it saves (docs/benchmarks.md, "Sockets").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from urllib.parse import urlsplit

from websockets.speedups import apply_mask

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_TEXT, _CONTINUATION, _CLOSE, _PING, _PONG = 0x1, 0x0, 0x8, 0x9, 0xA


class HandshakeRefused(Exception):
    """The server answered the opening handshake with something other than a valid 101."""


def _frame(opcode: int, payload: bytes) -> bytes:
    """A final client frame: masked, as RFC 6455 requires of every client frame."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    return head + mask + apply_mask(payload, mask)


class _Protocol(asyncio.Protocol):
    def __init__(self, request: bytes, accept: bytes) -> None:
        self.request, self.accept = request, accept
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.opened = asyncio.get_running_loop().create_future()
        self.waiter: asyncio.Future | None = None
        self.inbox: list[str] = []
        self.fragments: list[bytes] = []
        self.closed: Exception | None = None

    def connection_made(self, transport) -> None:  # noqa: ANN001
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("the server closed the connection"))

    def _end(self, exc: Exception) -> None:
        if self.closed is None:
            self.closed = exc
        if not self.opened.done():
            self.opened.set_exception(self.closed)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.closed)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.opened.done():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            del self.buffer[: end + 4]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])}
            if head[0].split(" ", 2)[1:2] != ["101"] or headers.get("sec-websocket-accept", "").encode() != self.accept:
                self.transport.close()
                self._end(HandshakeRefused(head[0]))
                return
            self.opened.set_result(None)
        self._read_frames()

    def _read_frames(self) -> None:
        buf = self.buffer
        while len(buf) >= 2:
            b0, b1 = buf[0], buf[1]
            n, at = b1 & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    return
                n, at = struct.unpack_from("!H", buf, 2)[0], 4
            elif n == 127:
                if len(buf) < 10:
                    return
                n, at = struct.unpack_from("!Q", buf, 2)[0], 10
            if b1 & 0x80:  # a server never masks (RFC 6455, 5.1)
                self.transport.close()
                self._end(ConnectionError("a masked frame from the server"))
                return
            if len(buf) < at + n:
                return
            payload = bytes(buf[at : at + n])
            del buf[: at + n]
            opcode = b0 & 0x0F
            if opcode == _PING:
                self.transport.write(_frame(_PONG, payload))
            elif opcode == _CLOSE:
                self.transport.write(_frame(_CLOSE, payload[:2]))
                self.transport.close()
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self._end(ConnectionError(f"closed by the server with {code}"))
                return
            elif opcode in (_TEXT, _CONTINUATION):
                self.fragments.append(payload)
                if b0 & 0x80:
                    self._deliver(b"".join(self.fragments).decode())
                    self.fragments = []

    def _deliver(self, text: str) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(text)
        else:
            self.inbox.append(text)


class LeanSocket:
    """One open WebSocket: `await connect(...)`, then send / recv / close as `websockets`' connection."""

    def __init__(self, protocol: _Protocol) -> None:
        self.protocol = protocol

    async def send(self, text: str) -> None:
        if self.protocol.closed is not None:
            raise self.protocol.closed
        self.protocol.transport.write(_frame(_TEXT, text.encode()))

    async def recv(self) -> str:
        p = self.protocol
        if p.inbox:
            return p.inbox.pop(0)
        if p.closed is not None:
            raise p.closed
        p.waiter = asyncio.get_running_loop().create_future()
        try:
            return await p.waiter
        finally:
            p.waiter = None

    async def close(self) -> None:
        p = self.protocol
        if p.closed is None and p.transport is not None and not p.transport.is_closing():
            p.transport.write(_frame(_CLOSE, struct.pack("!H", 1000)))
            p.transport.close()
        p._end(ConnectionError("closed by the client"))


async def connect(url: str, *, headers: dict[str, str], open_timeout: float) -> LeanSocket:
    """Open `url` (ws://host:port/path) and complete the handshake within `open_timeout` seconds."""
    parts = urlsplit(url)
    key = base64.b64encode(os.urandom(16))
    accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
    lines = [
        f"GET {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key.decode()}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    loop = asyncio.get_running_loop()

    async def opening() -> LeanSocket:
        _, protocol = await loop.create_connection(lambda: _Protocol(request, accept), parts.hostname, parts.port)
        try:
            await protocol.opened
        except BaseException:
            protocol.transport.close()
            raise
        return LeanSocket(protocol)

    return await asyncio.wait_for(opening(), open_timeout)
