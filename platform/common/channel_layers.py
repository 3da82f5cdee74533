"""The channel layers: with REDIS_URL, channels_redis's on a bounded connection pool; without, for a
single-process site, Channels' in-memory layer with its clean-up of expired messages and group
memberships run at most once a second.

channels_redis takes redis-py's default pool, which raises "Too many connections" past 100 commands
in flight: 500 sockets opening at once in one process failed to join their groups and closed with
1011. BoundedRedisChannelLayer's commands wait for a connection instead (common.redis_client).

Channels runs that clean-up on every `receive` and `group_send`, and it walks every channel and every
group: each socket waits on `receive`, so opening N sockets at once costs O(N^2), a visible part of
the server's CPU at N = 1,000 (docs/benchmarks.md, "Sockets"). Messages expire after 60 s and memberships
after a day; cleaning them up to a second late changes nothing a node sees.

Its commands are bounded like every Redis client's (common.redis_client: SAPO_REDIS_TIMEOUT_SECONDS),
but for the wait for a message: channels_redis blocks in BZPOPMIN for `brpop_timeout` (5 s) when
no message comes, so that wait reads on connections of its own that allow it twice that long: its
timeout is a Redis that hangs, never a busy event loop reading the empty answer late (a timeout that
fires as the loop cancels the wait at shutdown can lose the cancellation, and the loop never closes).
The closes listener (pool.closes) waits there; every other command (group_add, group_send) fails
within the bound on a Redis that hangs.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from redis import asyncio as aioredis

from common.redis_client import async_pool

#: Set while this task waits for a message (BZPOPMIN): its commands go to the waiting connections.
_waiting: contextvars.ContextVar[bool] = contextvars.ContextVar("waiting_for_a_message", default=False)

CLEAN_EVERY_SECONDS = 1.0


class ThrottledInMemoryChannelLayer(InMemoryChannelLayer):
    _cleaned_at = float("-inf")

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._cleaned_at < CLEAN_EVERY_SECONDS:
            return
        self._cleaned_at = now
        super()._clean_expired()


class BoundedRedisChannelLayer(RedisChannelLayer):
    def create_pool(self, index: int, **options: Any):
        host = {**self.hosts[index], **options}
        if "address" not in host:  # Sentinel or keyword hosts: channels_redis's own pools
            return super().create_pool(index)
        return async_pool(host.pop("address"), **host)

    async def _brpop_with_clean(self, *args: Any, **kwargs: Any):
        token = _waiting.set(True)
        try:
            return await super()._brpop_with_clean(*args, **kwargs)
        finally:
            _waiting.reset(token)

    def connection(self, index: int):
        client = super().connection(index)  # checks the index, and the loop's clients close with the loop
        if not _waiting.get() or "address" not in self.hosts[index]:
            return client
        # Kept beside channels_redis's own client for this loop and index (RedisLoopLayer._connections),
        # so that the layer's close_pools() and the loop's close close it too.
        clients = self._layers[asyncio.get_running_loop()]._connections
        key = ("waiting", index)
        if key not in clients:
            wait = 2 * self.brpop_timeout
            clients[key] = aioredis.Redis(connection_pool=self.create_pool(index, socket_timeout=wait))
        return clients[key]
