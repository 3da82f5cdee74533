"""common.redis_client: a pool's new connections do not look the client's version up again each; a
restart's stale connections are retried on new ones; a hung Redis costs a command one timeout
(SAPO_REDIS_TIMEOUT_SECONDS), the channel layer's commands too, but not its wait for a message."""

from __future__ import annotations

import asyncio
import time

import pytest

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


def test_a_hung_redis_costs_a_command_one_timeout_not_a_retry_each(settings) -> None:
    """A Redis that hangs (stopped: the kernel accepts, nothing answers) fails a command with a
    TimeoutError after SAPO_REDIS_TIMEOUT_SECONDS, on an open connection or a new one: a timeout is not
    retried (redis-py's default took 4 x 5 s)."""
    import redis
    from support.redis_server import redis_server

    settings.SAPO_REDIS_TIMEOUT_SECONDS = 1.0
    with redis_server() as server:
        settings.REDIS_URL = server.url
        client = redis_client.redis_client()
        try:
            assert client.ping()
            server.pause()
            for _ in range(2):  # the open connection, then a new one (the first was dropped on its timeout)
                started = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError):
                    client.ping()
                assert 0.9 <= time.monotonic() - started < 1.8
        finally:
            server.resume()
            client.close()
            redis_client._clients.clear()


async def test_a_hung_redis_costs_an_asyncio_command_one_timeout(settings) -> None:
    import redis
    import redis.asyncio as aioredis
    from support.redis_server import redis_server

    settings.SAPO_REDIS_TIMEOUT_SECONDS = 1.0
    with redis_server() as server:
        pool = redis_client.async_pool(server.url)
        client = aioredis.Redis(connection_pool=pool)
        try:
            assert await client.ping()
            server.pause()
            for _ in range(2):
                started = time.monotonic()
                with pytest.raises(redis.exceptions.TimeoutError):
                    await client.ping()
                assert 0.9 <= time.monotonic() - started < 1.8
        finally:
            server.resume()
            await pool.disconnect()


async def test_the_channel_layer_is_bounded_but_waits_for_a_message_longer_than_its_block(settings) -> None:
    """Its commands fail within the bound on a hung Redis; its wait for a message blocks in BZPOPMIN for
    brpop_timeout (5 s), so that wait reads for longer without failing."""
    import redis
    from support.redis_server import redis_server

    from common.channel_layers import BoundedRedisChannelLayer

    settings.SAPO_REDIS_TIMEOUT_SECONDS = 1.0
    with redis_server() as server:
        layer = BoundedRedisChannelLayer(hosts=[server.url], prefix="bounded")
        try:
            channel = await layer.new_channel()
            waiting = asyncio.create_task(layer.receive(channel))
            await asyncio.sleep(layer.brpop_timeout + 1.5)  # past one whole BZPOPMIN and the commands' bound
            await layer.send(channel, {"type": "after.a.quiet.while"})
            assert (await asyncio.wait_for(waiting, 10))["type"] == "after.a.quiet.while"
            await asyncio.to_thread(server.pause)
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                await layer.group_add("bounded-group", channel)
            assert time.monotonic() - started < 1.8
        finally:
            server.resume()
            await layer.close_pools()
