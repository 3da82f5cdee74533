"""ASGI entry point: HTTP goes to Django, `/ws/node/` to the pool's NodeConsumer.

No AllowedHostsOriginValidator: nodes are not browsers (no Origin header); they authenticate with
their bearer token inside the consumer.

Every way the site is served imports this module (runserver, the `daphne` command, the test
servers), so the two things a server process must do before it serves are done here:
- the WebSocket layer's message limit follows SAPO_MAX_FRAME_BYTES, autobahn's debug text is made only
  when logged, frames are unmasked with `websockets`' C function and a text message's UTF-8 is checked
  once (common.library_patches);
- a checkpoint upload whose announced length is missing or past its chunk cap is answered on its
  headers, before any of its body is read (audits.upload.body_refused): daphne's HTTP layer is patched
  for it (Twisted reads a whole body before daphne hands it on), and `BodyGate` does the same under
  any other ASGI server (Django's handler reads a whole body before the view);
- the objects made while starting (Django, the apps, reasoning-gym and sympy: ~210,000 the garbage
  collector tracks) are moved out of its reach (`gc.freeze`), once the module has loaded;
- the server's start-up step (`server_start`: forget the presence records this server's previous run
  left) runs once per process before its first request or socket is handled (daphne has no lifespan
  events; under a server that sends them, it runs on "lifespan.startup").
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
from collections.abc import Mapping

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Build the Django app first: it sets up the app registry before any consumer module is imported.
django_asgi_app = get_asgi_application()

from channels.db import database_sync_to_async  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from audits.upload import body_refused  # noqa: E402
from common import outage  # noqa: E402
from common.library_patches import install_for_serving  # noqa: E402
from nodes.presence import presence_server_start  # noqa: E402

# Imported at start-up, not on the first connection: it loads reasoning-gym, which on a busy
# machine can take longer than daphne's WebSocket handshake timeout.
from pool.limits import current_limits  # noqa: E402
from sockets.consumers import NodeConsumer  # noqa: E402

logger = logging.getLogger(__name__)

websocket_urlpatterns = [
    path("ws/node/", NodeConsumer.as_asgi()),
]


def body_check(method: str, path: str, headers: Mapping[str, str]) -> tuple[int, bytes] | None:
    """(status, JSON body) of the answer to a request refused on its headers; None: read it as usual."""
    refused = body_refused(method, path, headers)
    return None if refused is None else (refused.status, json.dumps(refused.as_dict()).encode())


class BodyGate:
    """Answers an HTTP request `body_check` refuses without receiving its body; hands on the rest."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "PUT":  # the only bodies checked (audits.upload)
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in reversed(scope["headers"])}
            answer = body_check(scope["method"], scope["path"], headers)
            if answer is not None:
                status, body = answer
                start = {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


router = ProtocolTypeRouter(
    {
        "http": BodyGate(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)


class ServerStart:
    """Runs `presence_server_start` once per process (a forked process runs it again: the pid is the
    key) before the first event is handed on to `app`."""

    def __init__(self, app) -> None:
        self.app = app
        self.started_pid: int | None = None
        self.lock: asyncio.Lock | None = None
        self.lock_pid: int | None = None

    async def start(self) -> None:
        pid = os.getpid()
        if self.started_pid == pid:
            return
        if self.lock is None or self.lock_pid != pid:
            self.lock, self.lock_pid = asyncio.Lock(), pid
        async with self.lock:
            if self.started_pid != pid:
                try:
                    await database_sync_to_async(presence_server_start)()
                except Exception as exc:  # not fatal: the old records expire on their own within a minute
                    if not outage.dependency_failed(exc):  # an outage is one line (common.outage), a bug its trace
                        logger.exception("forgetting the previous run's presence records failed")
                self.started_pid = pid

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await self.start()
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await self.start()
        await self.app(scope, receive, send)


install_for_serving(current_limits().websocket_max_bytes, body_check=body_check)
application = ServerStart(router)

# Python's cyclic collector walks every object it tracks on each full collection: start-up leaves some
# 200,000, and a thousand sockets opening at once set off full collections (docs/benchmarks.md,
# "Sockets"). What start-up made lives as long as the process:
# collect its garbage once, then keep the rest out of later collections.
gc.collect()
gc.freeze()
