"""Messages, frame bytes and server CPU per minute per node, counted across every connection of the node.

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
_local_cpu: dict[tuple[int, int], int] = {}
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


def _key(node_id: int, minute: int) -> str:
    return f"{settings.SAPO_REDIS_PREFIX}:rate:{node_id}:{minute}"


async def hit(
    node_id: int, limit: int, now: float | None = None, *, size: int = 0, byte_limit: int = 0, cpu_limit_ms: int = 0
) -> bool:
    """Count one frame of `size` bytes for the node; True when it is over `limit` frames, over
    `byte_limit` bytes (0: no byte limit), or has already cost `cpu_limit_ms` of server CPU (0: no
    CPU limit; see `charge`) this minute. Refused frames count too."""
    minute = int((now if now is not None else time.time()) // 60)
    if getattr(settings, "REDIS_URL", ""):
        key = _key(node_id, minute)
        async with _redis().pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, 120)
            pipe.incrby(key + ":bytes", size)
            pipe.expire(key + ":bytes", 120)
            pipe.get(key + ":cpu")
            replies = await pipe.execute()
        count, sent, spent = int(replies[0]), int(replies[2]), int(replies[4] or 0)
    else:
        local = (node_id, minute)
        count = _local_counts.get(local, 0) + 1
        _local_counts[local] = count
        sent = _local_bytes.get(local, 0) + size
        _local_bytes[local] = sent
        spent = _local_cpu.get(local, 0)
        if count == 1 and len(_local_counts) > 10_000:
            for old in [k for k in _local_counts if k[1] < minute]:
                del _local_counts[old]
                _local_bytes.pop(old, None)
                _local_cpu.pop(old, None)
    return count > limit or 0 < byte_limit < sent or 0 < cpu_limit_ms <= spent


async def charge(node_id: int, cpu_ms: int, now: float | None = None) -> None:
    """Add what handling one of the node's frames cost the server (CPU milliseconds) to this minute's
    count, which `hit` compares with the node's CPU limit before its next frame is parsed."""
    if cpu_ms <= 0:
        return
    minute = int((now if now is not None else time.time()) // 60)
    if getattr(settings, "REDIS_URL", ""):
        key = _key(node_id, minute) + ":cpu"
        async with _redis().pipeline(transaction=False) as pipe:
            pipe.incrby(key, cpu_ms)
            pipe.expire(key, 120)
            await pipe.execute()
        return
    _local_cpu[(node_id, minute)] = _local_cpu.get((node_id, minute), 0) + cpu_ms


def reset_local() -> None:
    """Forget in-process counts (tests)."""
    _local_counts.clear()
    _local_bytes.clear()
    _local_cpu.clear()
