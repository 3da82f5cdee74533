"""`python manage.py sapo_serve [--server daphne|uvicorn] [--host H] [--port P]`: replace this process
with the site's ASGI server (ops.serving), as deployed.

The server is a new interpreter that imports `config.asgi`: manage.py put `platform/` on its own
sys.path, which an exec does not pass on, so the server's PYTHONPATH names it (from any working
directory, with no PYTHONPATH set by hand)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from django.conf import settings
from django.core.management.base import BaseCommand

from ops.serving import SERVERS, server_argv
from pool.limits import current_limits


class Command(BaseCommand):
    help = "Serve the site (HTTP and the node WebSocket) with the ASGI server SAPO_ASGI_SERVER names."

    def add_arguments(self, parser):
        parser.add_argument("--server", choices=SERVERS, default=None, help="Default: SAPO_ASGI_SERVER.")
        parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a container's site listens on all
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--print", action="store_true", help="Print the command instead of running it.")

    def handle(self, *args, server, host, port, print, **options):
        argv = server_argv(
            server or settings.SAPO_ASGI_SERVER,
            host=host,
            port=port,
            websocket_max_bytes=current_limits().websocket_max_bytes,
        )
        if print:
            self.stdout.write(" ".join(argv))
            return
        os.execve(argv[0], argv, server_environ(os.environ))


def server_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the platform folder first on PYTHONPATH (kept once, whatever was there)."""
    platform_dir = str(settings.PLATFORM_DIR)
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != platform_dir]
    return {**environ, "PYTHONPATH": os.pathsep.join([platform_dir, *rest])}
