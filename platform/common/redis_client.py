"""The synchronous Redis client the apps share (presence, the limits on the doors), when REDIS_URL is set."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings

# Keyed by process too: a forked server must not share its parent's sockets.
_clients: dict[tuple[int, str], Any] = {}


def redis_client() -> Any:
    """One client per process and URL (its connection pool is thread-safe)."""
    import redis

    key = (os.getpid(), settings.REDIS_URL)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(settings.REDIS_URL)
    return client
