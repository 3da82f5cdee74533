"""common.redis_client: a pool's new connections do not look the client's version up again each."""

from __future__ import annotations

import asyncio

from common import redis_client


async def test_new_connections_reuse_the_version_resolved_once(redis_url, monkeypatch) -> None:
    import redis.asyncio as aioredis
    from redis import utils

    redis_client._connection_options()  # resolved once per process
    looked_up = []
    real = utils.get_lib_version
    monkeypatch.setattr(utils, "get_lib_version", lambda: looked_up.append(1) or real())
    pool = redis_client.async_pool(redis_url)
    client = aioredis.Redis(connection_pool=pool)
    try:
        assert await asyncio.gather(*(client.ping() for _ in range(8))) == [True] * 8  # 8 connections at once
        assert looked_up == []
        # The stock pool, for comparison, looks it up for every connection it opens.
        stock = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=8)
        other = aioredis.Redis(connection_pool=stock)
        await asyncio.gather(*(other.ping() for _ in range(8)))
        assert len(looked_up) >= 2
        await stock.disconnect()
    finally:
        await pool.disconnect()


def test_the_sync_client_retries_a_connection_redis_closed_when_it_restarted(settings) -> None:
    """After a restart every pooled connection is stale: the next command on each is retried on a new
    connection instead of failing (a frame or page each, before the retry)."""
    from support.redis_server import redis_server

    with redis_server() as redis:
        settings.REDIS_URL = redis.url
        client = redis_client.redis_client()
        try:
            assert client.ping()
            redis.restart()
            assert client.set("after-restart", 1) and client.get("after-restart") == b"1"
        finally:
            client.close()
            redis_client._clients.clear()


async def test_the_asyncio_pools_retry_a_connection_redis_closed_when_it_restarted() -> None:
    import redis.asyncio as aioredis
    from support.redis_server import redis_server

    with redis_server() as redis:
        pool = redis_client.async_pool(redis.url)
        client = aioredis.Redis(connection_pool=pool)
        try:
            assert await asyncio.gather(*(client.ping() for _ in range(4))) == [True] * 4  # 4 pooled connections
            await asyncio.to_thread(redis.restart)
            assert await asyncio.gather(*(client.ping() for _ in range(4))) == [True] * 4
        finally:
            await pool.disconnect()
