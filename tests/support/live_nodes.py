"""A node socket on a live server (tests/conftest.py's asgi_server), driven by hand with the websockets
library's synchronous client: welcomed, and watched for the code the server closes it with."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

HELLO = {"type": "hello", "v": 1, "client": "live-test", "model": "m", "hardware": "h"}
#: Seconds a test waits for a welcome or a reply.
TIMEOUT = 20.0


@contextmanager
def open_node(server, token: str, swarm: str | None = None) -> Iterator[ClientConnection]:
    """A node socket, welcomed (in `swarm`, by its slug; none: the site's default)."""
    with connect(
        f"{server.ws_url}/ws/node/", additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=TIMEOUT
    ) as ws:
        ws.send(json.dumps({**HELLO, **({"swarm": swarm} if swarm else {})}))
        assert json.loads(ws.recv(timeout=TIMEOUT))["type"] == "welcome"
        yield ws


def close_code(ws: ClientConnection, timeout: float) -> int | None:
    """The code the server closes `ws` with within `timeout` seconds (None: still open)."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ws.recv(timeout=max(0.1, deadline - time.monotonic()))
    except TimeoutError:
        return None
    except ConnectionClosed:
        return ws.close_code
    return None


def wait_for(condition: Callable[[], Any], timeout: float = 20.0) -> bool:
    """Whether `condition()` holds within `timeout` seconds (polled every 50 ms, and once at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())
