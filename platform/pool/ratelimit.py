"""Messages and frame bytes per minute per node, counted across every connection of the node.

With REDIS_URL set (a multi-process deployment: the channel layer is Redis too) the counter lives in
Redis, one key per node and minute (INCR + EXPIRE in one round trip), so it holds across connections
and server processes. Without REDIS_URL the deployment is one process (the in-memory channel layer
cannot span processes), and an in-process counter with the same fixed-minute semantics is exact.

A fixed window lets a node send up to twice the limit across a minute boundary; that is the price
of one cheap atomic operation per frame.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from django.conf import settings

_local_counts: dict[tuple[int, int], int] = {}
_local_bytes: dict[tuple[int, int], int] = {}
# Keyed by the loop object itself, not id(loop): an id can be reused by a later loop (or by a
# forked process's new loop) and hand it a client whose connections belong to a dead loop.
_redis_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, object] = weakref.WeakKeyDictionary()


def _redis():
    """One asyncio Redis client per event loop (clients are bound to the loop that made them)."""
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    client = _redis_clients.get(loop)
    if client is None:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        _redis_clients[loop] = client
    return client


async def hit(node_id: int, limit: int, now: float | None = None, *, size: int = 0, byte_limit: int = 0) -> bool:
    """Count one frame of `size` bytes for the node; True when it is over `limit` frames, or over
    `byte_limit` bytes (0: no byte limit), this minute. Refused frames count too."""
    minute = int((now if now is not None else time.time()) // 60)
    if getattr(settings, "REDIS_URL", ""):
        key = f"{settings.SAPO_REDIS_PREFIX}:rate:{node_id}:{minute}"
        async with _redis().pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, 120)
            if byte_limit:
                pipe.incrby(key + ":bytes", size)
                pipe.expire(key + ":bytes", 120)
            replies = await pipe.execute()
        return int(replies[0]) > limit or (byte_limit > 0 and int(replies[2]) > byte_limit)
    key = (node_id, minute)
    count = _local_counts.get(key, 0) + 1
    _local_counts[key] = count
    sent = _local_bytes.get(key, 0) + size
    _local_bytes[key] = sent
    if count == 1 and len(_local_counts) > 10_000:
        for old in [k for k in _local_counts if k[1] < minute]:
            del _local_counts[old]
            _local_bytes.pop(old, None)
    return count > limit or 0 < byte_limit < sent


def reset_local() -> None:
    """Forget in-process counts (tests)."""
    _local_counts.clear()
    _local_bytes.clear()
