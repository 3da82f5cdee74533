"""common.db's database threads (docs/benchmarks.md, "Sockets"): a call's result or exception comes back
to the awaiting coroutine; a thread keeps its connection between calls for a while, and drops one that
broke without a call failing on it (a PostgreSQL restart costs only the calls running during it, and
a call marked safe to repeat is run again on a fresh connection); every thread gives its connection
back on request (before a test database is dropped)."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from django.db import connection

from common import db
from common.errors import ApplicationError

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("pool_room")]


@pytest.fixture
def pool_room() -> None:
    """The process's own database threads give their connections back to the pool (they keep them
    between calls), so the threads made here can borrow theirs."""
    if db._threads is not None:
        db._threads.close_connections()


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def holds_connection() -> bool:
    return connection.connection is not None


@pytest.fixture
def one_thread():
    """A DbThreads of one thread: every call lands on the same thread."""
    threads = db.DbThreads(1, name="sapo-db-test")
    yield threads
    threads.stop()


async def call(threads: db.DbThreads, fn, *args, **kwargs):
    return await threads.submit(fn, args, kwargs)


async def test_results_and_exceptions_come_back_to_the_caller(one_thread) -> None:
    assert await call(one_thread, lambda a, b=0: a + b, 2, b=3) == 5

    def refuse() -> None:
        raise ApplicationError("banned", "no")

    with pytest.raises(ApplicationError) as raised:
        await call(one_thread, refuse)
    assert raised.value.code == "banned"
    assert await call(one_thread, lambda: "still serving") == "still serving"


async def test_a_thread_keeps_its_connection_between_calls(one_thread) -> None:
    first = await call(one_thread, backend_pid)
    assert await call(one_thread, holds_connection)  # kept after the call
    assert await call(one_thread, backend_pid) == first


async def test_a_connection_is_given_back_after_its_time(one_thread, monkeypatch) -> None:
    monkeypatch.setattr(db, "KEEP_CONNECTION_SECONDS", 0.0)
    await call(one_thread, backend_pid)
    assert not await call(one_thread, holds_connection)


async def test_a_connection_the_server_ended_costs_no_call(one_thread) -> None:
    """The server ends the thread's connection (as a PostgreSQL restart does): the next call gets a new
    connection instead of failing on the old one (common.pg_lost)."""
    pid = await call(one_thread, backend_pid)
    await asyncio.to_thread(terminate, pid)
    again = await call(one_thread, backend_pid)
    assert again != pid


def pid_after_losing_the_first_connection(runs: list[int]) -> int:
    """Ends its own session from another connection on its first run, then queries, as a call does whose
    database restarts under it: its backend pid, on the run that succeeds."""
    pid = backend_pid()
    runs.append(pid)
    if len(runs) == 1:
        terminate(pid)
    return backend_pid()


async def test_a_call_marked_safe_to_repeat_runs_again_on_a_fresh_connection_when_its_own_is_lost(one_thread):
    runs: list[int] = []
    again = await call(one_thread, db._retrying_lost(pid_after_losing_the_first_connection), runs)
    assert len(runs) == 2 and again == runs[1] != runs[0]
    # Without the mark the call fails, and the thread's next call gets a working connection.
    runs.clear()
    with pytest.raises(Exception, match="(?i)terminat|closed|lost"):
        await call(one_thread, pid_after_losing_the_first_connection, runs)
    assert len(runs) == 1 and await call(one_thread, backend_pid) != runs[0]


def terminate(pid: int) -> None:
    """Ends the session `pid` and returns once it has gone."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 10
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline
            time.sleep(0.01)


async def test_a_cancelled_caller_leaves_the_thread_serving(one_thread) -> None:
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(timeout=30)
        return "late"

    task = asyncio.ensure_future(call(one_thread, slow))
    await asyncio.to_thread(started.wait, 30)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await call(one_thread, lambda: "next") == "next"


async def test_calls_one_at_a_time_stay_on_the_thread_that_went_idle_last() -> None:
    # Its caches, its connection and its PostgreSQL backend are warm: calls taking turns among every
    # thread ran each share on a cold one.
    threads = db.DbThreads(4, name="sapo-db-test")
    try:
        # Once every thread has started and gone idle: one still starting would go idle after the
        # first call's thread and so be the one that went idle last (a race seen once in a full run).
        for _ in range(5000):
            if len(threads._idle) == len(threads.threads):
                break
            await asyncio.sleep(0.001)
        seen = [await call(threads, threading.get_ident) for _ in range(20)]
        assert len(set(seen)) == 1
        # Calls at once still spread over the threads, and are all answered.
        together = threading.Barrier(4)

        def meet() -> int:
            together.wait(timeout=30)
            return threading.get_ident()

        assert len(set(await asyncio.gather(*(call(threads, meet) for _ in range(4))))) == 4
        # More calls than threads wait their turn, in order, and none is lost.
        order: list[int] = []
        assert await asyncio.gather(*(call(threads, lambda i=i: order.append(i) or i) for i in range(50))) == list(
            range(50)
        )
        assert sorted(order) == list(range(50))
    finally:
        await asyncio.to_thread(threads.stop)


async def test_close_connections_gives_every_connection_back() -> None:
    threads = db.DbThreads(3, name="sapo-db-test")
    together = threading.Barrier(3)

    def meet() -> bool:  # three calls at once: one per thread, each borrowing a connection
        backend_pid()
        together.wait(timeout=30)
        return holds_connection()

    assert await asyncio.gather(*(call(threads, meet) for _ in range(3))) == [True, True, True]
    await asyncio.to_thread(threads.close_connections)
    together = threading.Barrier(3)

    def check() -> bool:
        together.wait(timeout=30)
        return holds_connection()

    assert await asyncio.gather(*(call(threads, check) for _ in range(3))) == [False, False, False]
    await asyncio.to_thread(threads.stop)
