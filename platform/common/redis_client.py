"""The Redis clients the apps share when REDIS_URL is set: a synchronous one (presence, the limits on
the doors) and, for asyncio code (the rate limits, the channel layer), bounded connection pools.

redis-py's asyncio pool opens a connection per command in flight and raises "Too many connections"
past 100 of them: 500 sockets opening at once in one process (each joining its channel groups) got
that error and a 1011 close (docs/benchmarks.md, "Sockets"). A blocking pool makes a command wait
for a free connection instead, up to REDIS_WAIT_SECONDS.

Both are given the client's name and version once (`_connection_options`): redis-py otherwise reads its
own package metadata (importlib.metadata, parsing the METADATA file) for every connection it opens,
and a crowd of sockets opening at once grows a worker's pool to 64 connections, a large part of the
rate limit's Redis time in that burst (docs/benchmarks.md, "Sockets").

Every command is bounded (`_bounds`): connecting and each answer wait at most
SAPO_REDIS_TIMEOUT_SECONDS (config/settings.py). With redis-py's defaults (5 s, and a timeout retried,
inside a connect retried too) a Redis that hangs (its process stopped: the kernel still accepts
connections, nothing answers) holds a node's share, a socket's opening and a page for several times
that. With the bound the caller gets a TimeoutError and takes the same degraded path as for a stopped
Redis (docs/deploy.md, "When Redis fails").

A command that meets a dead connection is tried once more, on a new one (`_retry_options`): after
Redis restarts each pooled connection is stale, and without the retry each one failed one more frame
or page before the pool replaced it. A timeout is not retried: a Redis that did not answer within the
bound does not answer the same command sooner, and each retry would wait the whole bound again.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from django.conf import settings

# Keyed by process too: a forked server must not share its parent's sockets.
_clients: dict[tuple[int, str], Any] = {}


#: Connections one asyncio pool keeps to Redis at most (per process and event loop).
REDIS_MAX_CONNECTIONS = 64
#: How long a command waits for a free connection before failing.
REDIS_WAIT_SECONDS = 30


#: Retries of a command whose connection failed (a stale one after a restart), at once, on a new one.
REDIS_RETRIES = 1


def _retry_options(*, asyncio: bool) -> dict[str, Any]:
    """redis-py's Retry for a connection: a ConnectionError retried once, a TimeoutError never."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError

    if asyncio:
        from redis.asyncio.retry import Retry
    else:
        from redis.retry import Retry
    # supported_errors given: redis-py's default list retries TimeoutError too.
    return {"retry": Retry(NoBackoff(), REDIS_RETRIES, supported_errors=(ConnectionError,))}


def _bounds() -> dict[str, float]:
    """How long a connection may take to open and a command to be answered."""
    return {
        "socket_connect_timeout": settings.SAPO_REDIS_TIMEOUT_SECONDS,
        "socket_timeout": settings.SAPO_REDIS_TIMEOUT_SECONDS,
    }


@functools.cache
def _connection_options() -> dict[str, Any]:
    """What each new connection would otherwise work out again: the client's name and version (for
    Redis' CLIENT SETINFO), resolved once per process. Empty with a redis-py that does not take it."""
    try:
        from redis.driver_info import DriverInfo
        from redis.utils import get_lib_version
    except ImportError:
        return {}
    return {"driver_info": DriverInfo(name="redis-py", lib_version=get_lib_version())}


def async_pool(url: str, pool_class: Any = None, **options: Any) -> Any:
    """A bounded asyncio connection pool for `url` (a command waits for a free connection); `options`
    override the connections' defaults (the channel layer's wait for a message reads for longer).
    `pool_class`: a subclass of redis-py's BlockingConnectionPool to build instead."""
    import redis.asyncio as aioredis

    pool_class = pool_class or aioredis.BlockingConnectionPool
    return pool_class.from_url(
        url,
        max_connections=REDIS_MAX_CONNECTIONS,
        timeout=REDIS_WAIT_SECONDS,
        **{**_connection_options(), **_retry_options(asyncio=True), **_bounds(), **options},
    )


def redis_client() -> Any:
    """One client per process and URL (its connection pool is thread-safe)."""
    import redis

    key = (os.getpid(), settings.REDIS_URL)
    client = _clients.get(key)
    if client is None:
        client = _clients[key] = redis.Redis.from_url(
            settings.REDIS_URL, **_connection_options(), **_retry_options(asyncio=False), **_bounds()
        )
    return client
