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

Its operations are bounded like every Redis client's commands (SAPO_REDIS_TIMEOUT_SECONDS), but
by an asyncio timeout around each (`_bounded`), not by redis-py's socket timeout: with one, redis-py
sends through asyncio.wait_for, which on Python 3.11 loses a task's cancellation when it lands as the
send completes (fixed in 3.12), and the closes listener (sockets.closes), always sending or waiting, then
outlives its event loop's shutdown. The wait for a message blocks in BZPOPMIN for `brpop_timeout`
(5 s) when no message comes, so it may take twice that: its timeout is a Redis that hangs, never a
busy loop reading the empty answer late.

The bound is Redis' answer, not the queue for a connection (`_QueuePatientPool`): a burst of 400
sockets joining their groups at once in one process shares the pool's 64 connections, and with the
wait for a free one inside the 0.5 s bound, the later joins failed as if Redis had stopped (a loaded
machine's full test run did). A command waits for a connection as every client's does, up to
REDIS_WAIT_SECONDS (common.redis_client), and from the moment it has one, Redis has the bound to
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer
from django.conf import settings
from redis.asyncio import BlockingConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

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


#: The operation's deadline and its length while one runs in this task (`_bounded`).
_BOUND: contextvars.ContextVar[tuple[asyncio.Timeout, float] | None] = contextvars.ContextVar(
    "channel_layer_bound", default=None
)


@contextlib.asynccontextmanager
async def _bounded(seconds: float | None = None) -> AsyncIterator[None]:
    """At most `seconds` (SAPO_REDIS_TIMEOUT_SECONDS) for Redis to answer each command run inside,
    counted from when it has a connection; past it, redis-py's TimeoutError, which common.outage counts
    as Redis unavailable."""
    seconds = settings.SAPO_REDIS_TIMEOUT_SECONDS if seconds is None else seconds
    try:
        async with asyncio.timeout(seconds) as deadline:
            token = _BOUND.set((deadline, seconds))
            try:
                yield
            finally:
                _BOUND.reset(token)
    except TimeoutError as exc:
        raise RedisTimeoutError(f"the channel layer's Redis did not answer within {seconds:g} s") from exc


class _QueuePatientPool(BlockingConnectionPool):
    """Waits for a free connection outside the operation's bound (its own limit is the pool's
    `timeout`, REDIS_WAIT_SECONDS), then gives Redis the whole bound from there."""

    async def get_connection(self, *args: Any, **kwargs: Any):
        bound = _BOUND.get()
        if bound is None:
            return await super().get_connection(*args, **kwargs)
        deadline, seconds = bound
        deadline.reschedule(None)
        try:
            async with self._condition:
                async with asyncio.timeout(self.timeout):
                    await self._condition.wait_for(self.can_get_connection)
                # Taken under the same lock hold as the wait saw it free (redis-py's own
                # get_connection does the same), so no other command takes it in between.
                async with self._maybe_pool_lock():
                    connection = self.get_available_connection()
        except TimeoutError as exc:
            raise RedisConnectionError("No connection available.") from exc
        deadline.reschedule(asyncio.get_running_loop().time() + seconds)
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection


class BoundedRedisChannelLayer(RedisChannelLayer):
    def create_pool(self, index: int):
        host = dict(self.hosts[index])
        if "address" not in host:  # Sentinel or keyword hosts: channels_redis's own pools
            return super().create_pool(index)
        host.setdefault("socket_timeout", None)  # each operation is bounded instead (module docstring)
        return async_pool(host.pop("address"), pool_class=_QueuePatientPool, **host)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        async with _bounded():
            await super().send(channel, message)

    async def group_add(self, group: str, channel: str) -> None:
        async with _bounded():
            await super().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        async with _bounded():
            await super().group_discard(group, channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        async with _bounded():
            await super().group_send(group, message)

    async def _brpop_with_clean(self, *args: Any, **kwargs: Any):
        async with _bounded(2 * self.brpop_timeout):
            return await super()._brpop_with_clean(*args, **kwargs)
