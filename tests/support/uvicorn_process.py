"""A live server on uvicorn, the way `manage.py sapo_serve` runs it (ops.serving): the twin of
daphne.testing.DaphneProcess that tests/conftest.py's `live_server` and `asgi_server` start when
SAPO_TEST_ASGI_SERVER=uvicorn, so the WebSocket tests can run against either server."""

from __future__ import annotations

import multiprocessing
import socket
import traceback


class UvicornProcess(multiprocessing.Process):
    """Forks, builds the application with `get_application()` in the child and serves it with uvicorn on
    host:port (port 0: a free one, written to `.port` once listening, then `.ready` is set)."""

    def __init__(self, host: str, get_application, port: int = 0) -> None:
        super().__init__()
        self.host = host
        self.get_application = get_application
        self.port = multiprocessing.Value("i", port)
        self.ready = multiprocessing.Event()
        self.errors = multiprocessing.Queue()

    def run(self) -> None:
        try:
            import uvicorn

            from ops.serving import BACKLOG
            from pool.limits import current_limits

            application = self.get_application()
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port.value))
            self.port.value = listener.getsockname()[1]
            # The options ops.serving gives on the command line.
            config = uvicorn.Config(
                application,
                backlog=BACKLOG,
                access_log=False,
                proxy_headers=False,
                lifespan="on",
                loop="uvloop",
                http="httptools",
                ws="websockets-sansio",
                ws_max_size=current_limits().websocket_max_bytes,
                ws_per_message_deflate=False,
                log_level="warning",
            )
            ready = self.ready

            class Server(uvicorn.Server):
                async def startup(self, sockets=None) -> None:
                    await super().startup(sockets)
                    ready.set()

            Server(config).run(sockets=[listener])
        except BaseException as exc:
            self.errors.put((exc, traceback.format_exc()))
