"""bench/leanws.py, the sockets benchmark's lean WebSocket client, against the `websockets` library's
server: the handshake checked, messages of every length encoding both ways, fragments joined, pings
answered, a server's close and a refused handshake reported."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.http11 import Response

# Last, not first: bench/pool.py would otherwise shadow the platform's pool package for every process
# the run starts afterwards (a multiprocessing child unpickling pool.build_worker imports by this path).
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import leanws  # noqa: E402


async def _server(handler, process_request=None):
    return await serve(handler, "127.0.0.1", 0, process_request=process_request, max_size=None)


def _url(server) -> str:
    port = next(iter(server.sockets)).getsockname()[1]
    return f"ws://127.0.0.1:{port}/ws/node/"


async def test_messages_of_every_length_go_both_ways_and_the_handshake_carries_the_headers():
    seen = {}

    async def echo(ws):
        seen["authorization"] = ws.request.headers["Authorization"]
        seen["path"] = ws.request.path
        async for message in ws:
            await ws.send(message[::-1])

    async with await _server(echo) as server:
        sock = await leanws.connect(_url(server), headers={"Authorization": "Bearer t0k"}, open_timeout=5)
        for n in (0, 5, 125, 126, 65_535, 65_536, 300_000):  # the 7-bit, 16-bit and 64-bit length forms
            text = "".join(chr(0x61 + i % 26) for i in range(n - 1)) + "é" if n else ""
            await sock.send(text)
            assert await sock.recv() == text[::-1]
        await sock.close()
    assert seen == {"authorization": "Bearer t0k", "path": "/ws/node/"}


async def test_fragments_are_joined_a_ping_is_answered_and_a_close_is_reported():
    pong = {}

    async def talk(ws):
        await ws.recv()
        await ws.send(["frag", "ment", "ed"])  # one message in three frames
        pong["latency"] = await asyncio.wait_for(await ws.ping(b"p1"), 5)  # resolved by the client's pong
        await ws.send("after the ping")
        await ws.close(4001, "token revoked")

    async with await _server(talk) as server:
        sock = await leanws.connect(_url(server), headers={}, open_timeout=5)
        await sock.send("hello")
        assert await sock.recv() == "fragmented"
        assert await sock.recv() == "after the ping"
        with pytest.raises(ConnectionError, match="4001"):
            await sock.recv()
    assert pong["latency"] >= 0


async def test_a_refused_handshake_and_a_refused_connection_raise():
    def refuse(connection, request):
        return Response(403, "Forbidden", Headers([("Content-Length", "0")]), b"")

    async with await _server(lambda ws: ws.wait_closed(), process_request=refuse) as server:
        with pytest.raises(leanws.HandshakeRefused, match="403"):
            await leanws.connect(_url(server), headers={}, open_timeout=5)
        url = _url(server)
    with pytest.raises(ConnectionRefusedError):
        await leanws.connect(url, headers={}, open_timeout=5)
