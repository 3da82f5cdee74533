"""common.outage: only a dependency that is down or unreachable is an outage (one log line); a
constraint violation or a bad statement is a bug, and its caller logs the trace. While down, one use
a probe interval tries the dependency again."""

from __future__ import annotations

import time

import django.db
import psycopg
import pytest
from redis.exceptions import BusyLoadingError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from common import outage


@pytest.fixture(autouse=True)
def _no_outage():
    outage.forget_outages()
    yield
    outage.forget_outages()


@pytest.mark.parametrize(
    ("exc", "dependency"),
    [
        (django.db.OperationalError("server closed the connection unexpectedly"), outage.DATABASE),
        (django.db.InterfaceError("connection already closed"), outage.DATABASE),
        (psycopg.OperationalError("connection refused"), outage.DATABASE),
        (RedisConnectionError("Error 111 connecting"), outage.REDIS),
        (BusyLoadingError("Redis is loading the dataset in memory"), outage.REDIS),
        (ConnectionRefusedError(111, "Connection refused"), outage.REDIS),
    ],
)
def test_a_dependency_down_is_an_outage(exc, dependency) -> None:
    assert outage.dependency_failed(exc) is True
    assert dependency.down


@pytest.mark.parametrize(
    "exc",
    [
        django.db.IntegrityError('insert or update on table "pool_rollout" violates foreign key constraint'),
        django.db.ProgrammingError("column does not exist"),
        psycopg.errors.UniqueViolation("duplicate key value"),
        ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
        ValueError("a bug"),
    ],
)
def test_a_bug_is_no_outage(exc) -> None:
    assert outage.dependency_failed(exc) is False
    assert not outage.DATABASE.down and not outage.REDIS.down


def test_while_down_one_use_a_probe_interval_tries_the_dependency(monkeypatch) -> None:
    from redis.exceptions import TimeoutError as RedisTimeoutError

    monkeypatch.setattr(outage, "PROBE_SECONDS", 0.2)
    assert outage.REDIS.skip() is False  # up: every use tries it
    outage.REDIS.failed(RedisTimeoutError("Timeout reading from socket"))
    assert outage.REDIS.skip() is True  # just failed: the others degrade at once
    time.sleep(0.25)
    assert outage.REDIS.skip() is False  # the probe
    assert outage.REDIS.skip() is True  # and only one
    outage.REDIS.answered()
    assert outage.REDIS.skip() is False
