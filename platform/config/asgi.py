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

# Imported at start-up, not on the first connection: it loads reasoning-gym, which on a busy
# machine can take longer than daphne's WebSocket handshake timeout.
from pool.consumers import NodeConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/node/", NodeConsumer.as_asgi()),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
