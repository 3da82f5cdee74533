"""ASGI entry point: HTTP goes to Django, `/ws/node/` to the pool's NodeConsumer.

No AllowedHostsOriginValidator: nodes are not browsers (no Origin header); they authenticate with
their bearer token inside the consumer.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Build the Django app first: it sets up the app registry before any consumer module is imported.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402


class LazyConsumer:
    """An ASGI app that imports its consumer class on first use (by dotted path).

    The routing table must not import app modules at load time, so the site starts even while an
    app's consumer module is being written or fails to import (the socket then fails, not the site).
    """

    def __init__(self, dotted_path: str) -> None:
        self.dotted_path = dotted_path
        self._app = None

    async def __call__(self, scope, receive, send):
        if self._app is None:
            self._app = import_string(self.dotted_path).as_asgi()
        return await self._app(scope, receive, send)


websocket_urlpatterns = [
    path("ws/node/", LazyConsumer("pool.consumers.NodeConsumer")),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
