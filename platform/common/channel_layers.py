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
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer

from common.redis_client import async_pool

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
    def create_pool(self, index: int):
        host = dict(self.hosts[index])
        if "address" not in host:  # Sentinel or keyword hosts: channels_redis's own pools
            return super().create_pool(index)
        return async_pool(host.pop("address"), **host)
