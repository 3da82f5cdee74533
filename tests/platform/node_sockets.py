"""Helpers for tests that talk to the node WebSocket in process (WebsocketCommunicator over the
project's ASGI application). No tests here; the `fresh_rate_counts` fixture is in conftest.py."""

from __future__ import annotations

import json

from channels.testing import WebsocketCommunicator

from config.asgi import application

# How long a reply may take. A share's answer takes well under a second here, but a fresh machine's
# full run (.ci/run) once answered one after more than 5 s, its whole process stalled (the channel
# layer's wait for a message, bounded at 10 s for a 5 s BZPOPMIN, timed out in the same seconds);
# a wait that ends as soon as the reply comes costs nothing longer.
TIMEOUT = 20


async def open_socket(token: str | None, *, scheme: str = "Bearer", hello: bool = False) -> WebsocketCommunicator:
    """A connected socket. With hello=True it has also been welcomed, so it is registered for closes
    (sockets.closes: a ban sent now reaches it)."""
    headers = [(b"authorization", f"{scheme} {token}".encode())] if token is not None else []
    socket = WebsocketCommunicator(application, "/ws/node/", headers=headers)
    connected, _ = await socket.connect(timeout=TIMEOUT)
    assert connected  # the consumer accepts first, then closes with a code when it refuses
    if hello:
        reply = await ask(socket, {"type": "hello", "v": 1, "client": "t", "model": "m", "hardware": "h"})
        assert reply["type"] == "welcome", reply
    return socket


async def close_code(socket: WebsocketCommunicator, *, settle: float = 0.5) -> int:
    """The code the server closed the socket with. Then lets the consumer finish (it updates presence
    on disconnect) for up to `settle` seconds before the test's loop ends; past that it is cancelled
    (the Redis layer's reader may take longer to stop)."""
    output = await socket.receive_output(timeout=TIMEOUT)
    assert output["type"] == "websocket.close", output
    await socket.send_input({"type": "websocket.disconnect", "code": output["code"]})
    await socket.wait(settle)
    return output["code"]


async def ask(socket: WebsocketCommunicator, frame: dict | str) -> dict:
    await socket.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))
    return await socket.receive_json_from(timeout=TIMEOUT)
