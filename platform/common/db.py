"""Database calls from async code (the node socket, presence's heartbeat): `await db_call(fn)(**kw)`.

Channels' `database_sync_to_async` runs, by default, every call of the process on one shared thread
(thread_sensitive=True): a thousand sockets then wait in one queue, one query at a time. `db_call`
runs them on a pool of settings.SAPO_DB_THREADS threads instead, each borrowing a connection from
Django's connection pool for the length of the call (config/settings.py, SAPO_DB_POOL_SIZE: the
threads are two fewer than the connections, so pages served on Django's own thread still find one).

What may go through it: a function that does all its database work inside the call (a service or
selector, its own transaction included) and keeps no state on the thread between calls. Every
service and selector the consumer calls is such a function; none relies on running on the thread
of an earlier call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection, transaction

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid: int | None = None


def db_executor() -> ThreadPoolExecutor:
    """This process's thread pool for database calls (a forked process makes its own: a fork copies
    the pool but not its threads)."""
    global _executor, _executor_pid
    pid = os.getpid()
    if _executor is None or _executor_pid != pid:
        with _lock:
            if _executor is None or _executor_pid != pid:
                _executor = ThreadPoolExecutor(max_workers=settings.SAPO_DB_THREADS, thread_name_prefix="sapo-db")
                _executor_pid = pid
    return _executor


def db_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a coroutine function run on the database threads, with Channels' connection clean-up
    around it (the connection goes back to the pool after the call)."""
    return database_sync_to_async(fn, thread_sensitive=False, executor=db_executor())


@contextmanager
def bookkeeping_transaction() -> Iterator[None]:
    """A transaction whose commit does not wait for the disk (synchronous_commit off), for writes a
    database crash may lose the last moment of: presence records, last seen, last used. An autocommit
    UPDATE waits for the WAL flush (milliseconds); this costs two statements (BEGIN and SET) more but
    no flush. Inside a transaction already, nothing is added: the outer one commits."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield
