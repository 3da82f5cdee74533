"""The command line of a site process: `python manage.py sapo_serve` runs it (docs/deploy.md,
"Processes"; the Dockerfile, docker-compose.yml and bench/sockets.py use it).

Both ASGI servers serve `config.asgi:application`; what each needs said on its command line:
- a listen backlog of 4096 (the kernel caps it at `net.core.somaxconn`): with twisted's default of
  50, ten thousand nodes coming back at once overflow the queue of connections waiting to be
  accepted, and TCP retries the dropped ones after pauses that double from 1 s;
- no access log, nor uvicorn's lines at INFO: the proxy in front writes one, and a server's own is
  lines per socket;
- daphne: as long for the application to accept a socket as a node waits for its handshake
  (sapo_node's OPEN_TIMEOUT): daphne's own 5 s refuses, with a 403, every socket of a storm that
  waits longer than that for the event loop;
- uvicorn: the protocol's frame limit (Limits.websocket_max_bytes; daphne's follows it through
  common.library_patches), no per-message compression (daphne has none: a sample's JSON compressed
  per socket would cost more CPU than the bytes it saves on a LAN link to the proxy), and no
  X-Forwarded-For of its own (the site reads it, SAPO_NUM_PROXIES).
"""

from __future__ import annotations

import sys

#: The servers `sapo_serve` runs (settings.SAPO_ASGI_SERVER chooses).
SERVERS = ("daphne", "uvicorn")
BACKLOG = 4096
#: sapo_node.transport.websocket.OPEN_TIMEOUT: what a node waits for its handshake.
HANDSHAKE_SECONDS = 30


def server_argv(server: str, *, host: str, port: int, websocket_max_bytes: int) -> list[str]:
    """The argv that serves the site with `server` on host:port."""
    if server == "daphne":
        return [
            sys.executable,
            "-m",
            "daphne",
            "-v",
            "0",
            "--websocket_connect_timeout",
            str(HANDSHAKE_SECONDS),
            "-e",
            f"tcp:port={port}:interface={host}:backlog={BACKLOG}",
            "config.asgi:application",
        ]
    if server == "uvicorn":
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--host",
            host,
            "--port",
            str(port),
            "--backlog",
            str(BACKLOG),
            "--no-access-log",
            "--log-level",
            "warning",  # uvicorn logs two lines per socket at INFO
            "--no-proxy-headers",
            "--lifespan",
            "on",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--ws",
            "websockets-sansio",
            "--ws-max-size",
            str(websocket_max_bytes),
            "--ws-per-message-deflate",
            "false",
            "config.asgi:application",
        ]
    raise ValueError(f"unknown ASGI server {server!r}: one of {', '.join(SERVERS)}")
