"""Database calls from async code (the node socket, presence's heartbeat): `await db_call(fn)(**kw)`.

Channels' `database_sync_to_async` runs, by default, every call of the process on one shared thread
(thread_sensitive=True): a thousand sockets then wait in one queue, one query at a time. `db_call`
runs them on settings.SAPO_DB_THREADS threads of its own instead (`DbThreads`), each borrowing a connection from
Django's connection pool and keeping it for its next calls, a few minutes (config/settings.py,
SAPO_DB_POOL_SIZE: the threads are two fewer than the connections, so pages served on Django's own
thread still find one).

What may go through it: a function that does all its database work inside the call (a service or
selector, its own transaction included) and keeps no state on the thread between calls. Every
service and selector the consumer calls is such a function; none relies on running on the thread
of an earlier call.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg
from django import db as django_db
from django.conf import settings
from django.db import connection, connections, transaction
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg_pool import PoolTimeout

from common.library_patches.psycopg import cache_statements_up_to
from common.native import native
from common.pg_lost import finish_if_lost

_lock = threading.Lock()
_threads: DbThreads | None = None

#: psycopg converts a statement's %(name)s placeholders once per text and caches the result, but only
#: for texts of at most 4,096 bytes (a guard against ORMs' ever-different statements); a longer one is
#: parsed again at every execution. The pool's INSERT with moderation's record (pool.seams.RecordPart)
#: is longer and runs for every share, so it would be parsed again at every share. Its texts are
#: fixed, a handful, so the limit is raised for them (common.library_patches.psycopg;
#: tests/platform/test_pool_schema.py checks the statements fit, and that psycopg caches them).
STATEMENT_CACHE_BYTES = 8192
cache_statements_up_to(STATEMENT_CACHE_BYTES)

#: How long a database thread keeps the connection it borrowed from the pool before giving it back
#: (with the pool on, SAPO_CONN_MAX_AGE 0): borrowing and returning one around every call (Django's
#: connect() and close() with the pool) costs more CPU than a small query itself.
KEEP_CONNECTION_SECONDS = 300.0


class _Seat:
    """One database thread's place: the call handed to it, and the lock it waits on while idle
    (held while it has nothing to do; released by whoever hands it a call)."""

    __slots__ = ("call", "wake")

    def __init__(self) -> None:
        self.call: Any = None
        self.wake = threading.Lock()
        self.wake.acquire()


class DbThreads:
    """`size` threads taking calls in the order they come. A call's result (or exception) goes straight
    back to the event loop that made it: no concurrent.futures Future, no asgiref layer. asgiref's
    `sync_to_async` and ThreadPoolExecutor add CPU to every call on top of the call itself (a
    SyncToAsync object per call, two Futures chained across threads, the executor's idle semaphore on
    every submit; docs/benchmarks.md, "Sockets"), and a socket makes several calls.

    A call goes to the thread that went idle last (a stack of idle threads, not a shared queue, whose
    waiting threads take turns): under light load the same few threads and their connections do all
    the work, with their CPU caches, their PostgreSQL backends' caches and their prepared statements
    warm. Taking turns, every share would run on a cold thread and backend (docs/benchmarks.md,
    "What a socket costs")."""

    def __init__(self, size: int, name: str = "sapo-db") -> None:
        self.pid = os.getpid()
        self._mutex = threading.Lock()
        self._pending: collections.deque = collections.deque()  # calls no thread has taken yet, in order
        self._idle: list[_Seat] = []  # idle threads' seats, the last one to go idle at the end
        self.threads = [
            threading.Thread(target=self._work, args=(_Seat(),), name=f"{name}_{i}", daemon=True) for i in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        # The caller's context variables, as sync_to_async passes them (a log filter may read one).
        self._put((loop, future, contextvars.copy_context(), fn, args, kwargs))
        return future

    def _put(self, call: Any) -> None:
        """Hand `call` to the thread that went idle last, or queue it for the first to finish."""
        with self._mutex:
            if not self._idle:
                self._pending.append(call)
                return
            seat = self._idle.pop()
        seat.call = call
        seat.wake.release()

    def _take(self, seat: _Seat, outcome: tuple[Any, ...] | None = None) -> Any:
        """The next call for the thread at `seat`: the oldest queued one, or, none queued, the one
        handed to it once idle (it waits for it). `outcome`, the result of its last call, is handed
        back to the awaiting event loop only once the thread is idle (or has its next call): the
        caller's next call then finds this thread on top of the idle stack, never a race lost to a
        thread that went idle while this one was still finishing."""
        with self._mutex:
            queued = bool(self._pending)
            call = self._pending.popleft() if queued else None
            if not queued:
                self._idle.append(seat)
        if outcome is not None:
            loop, *result = outcome
            try:
                loop.call_soon_threadsafe(*result)
            except RuntimeError:  # the loop has closed: nobody is waiting for this result
                pass
        if queued:
            return call
        seat.wake.acquire()
        call, seat.call = seat.call, None
        return call

    def _work(self, seat: _Seat) -> None:
        kept: dict[str, tuple[Any, float]] = {}  # this thread's connections: alias -> (connection, give back at)
        outcome: tuple[Any, ...] | None = None
        while True:
            call = self._take(seat, outcome)
            outcome = None
            if call is None:  # stop()
                connections.close_all()
                return
            if isinstance(call, threading.Barrier):  # close_connections(): give them back, then go on
                connections.close_all()
                kept.clear()
                call.wait()
                continue
            loop, future, context, fn, args, kwargs = call
            try:
                try:
                    _drop_lost(kept)
                    outcome = (loop, _succeed, future, context.run(fn, *args, **kwargs))
                finally:
                    _tidy(kept)
            except BaseException as exc:  # handed to the awaiting coroutine, raised there
                outcome = (loop, _fail, future, exc)

    def close_connections(self, timeout: float = 60) -> None:
        """Every thread gives its connections back (to the pool, or closes them), once each: before a
        database is dropped (tests) or the process stops. Waits until all have."""
        everyone = threading.Barrier(len(self.threads) + 1, timeout=timeout)  # a thread takes one, then waits
        for _ in self.threads:
            self._put(everyone)
        everyone.wait()

    def stop(self, timeout: float = 60) -> None:
        """The threads give their connections back and end, after the calls already queued."""
        for _ in self.threads:
            self._put(None)
        for thread in self.threads:
            thread.join(timeout)


def _tidy(kept: dict[str, tuple[Any, float]]) -> None:
    """After a call, Django's own clean-up of the thread's connections (close_if_unusable_or_obsolete:
    one that failed and is no longer usable, or left outside autocommit, is closed), except that a
    connection from the pool is kept for the thread's next call until KEEP_CONNECTION_SECONDS after it
    was borrowed. With SAPO_CONN_MAX_AGE > 0 (no pool) Django's own age applies."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            kept.pop(conn.alias, None)
            continue
        if not conn.settings_dict["CONN_MAX_AGE"]:
            entry = kept.get(conn.alias)
            if entry is None or entry[0] is not raw:  # borrowed during this call
                entry = kept[conn.alias] = (raw, now + KEEP_CONNECTION_SECONDS)
            conn.close_at = entry[1]
        conn.close_if_unusable_or_obsolete()
        if conn.connection is None:
            kept.pop(conn.alias, None)


def _drop_lost(kept: dict[str, tuple[Any, float]]) -> bool:
    """Close this thread's connections that the server ended while they were kept (a database restart
    ends every session): each would fail the call it next served, long after the database was back.
    A poll() of its socket, no round trip (common.pg_lost). Whether any was."""
    dropped = False
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is not None and not conn.in_atomic_block and finish_if_lost(raw):
            conn.close()  # a pooled one goes back to the pool, which throws a closed one away
            kept.pop(conn.alias, None)
            dropped = True
    return dropped


#: What a statement on a connection that was lost raises (through Django's cursor, or psycopg's own).
_CONNECTION_ERRORS = (
    django_db.OperationalError,
    django_db.InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def _retrying_lost(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, run once more on a fresh connection when it failed because its connection was lost (the
    server ended the session between the check before the call and its first statement). Only for a
    function that may run twice: a read, or a write idempotent by its ids (a share, a session's open)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _CONNECTION_ERRORS as exc:
            if no_connection_to_be_had(exc):  # the database is down: a second try waits as long again
                raise
            # Lost: the connection is broken now, or gone (a transaction's rollback failed on it, and
            # Django dropped it).
            lost = connection.connection is None or _drop_lost({})
            if connection.in_atomic_block or not lost:
                raise
        return fn(*args, **kwargs)

    return call


def no_connection_to_be_had(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps: Django re-raises psycopg's errors as its own) is the pool's
    timeout: no connection came within SAPO_DB_POOL_TIMEOUT, so a node socket opening closes with 4503
    within that time rather than after a retry as long again."""
    while exc is not None:
        if isinstance(exc, PoolTimeout):
            return True
        exc = exc.__cause__
    return False


def _succeed(future: asyncio.Future, result: Any) -> None:
    if not future.done():  # the awaiting task may have been cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def db_threads() -> DbThreads:
    """This process's database threads (a forked process starts its own: a fork copies the object but
    not its threads)."""
    global _threads
    pid = os.getpid()
    if _threads is None or _threads.pid != pid:
        with _lock:
            if _threads is None or _threads.pid != pid:
                _threads = DbThreads(settings.SAPO_DB_THREADS)
    return _threads


def db_call(fn: Callable[..., Any], *, retry_lost: bool = False) -> Callable[..., Any]:
    """`fn` as a coroutine function run on the database threads, with Django's connection clean-up
    after it (a thread keeps its connection for its next calls, see `_tidy`; one a database restart
    ended meanwhile is replaced before the call, `_drop_lost`, and the pool checks each one it hands
    out, config.pg_backend). With `retry_lost`, a call whose connection was lost under it runs once
    more on a fresh one (`_retrying_lost`: only for a function that may run twice). Cancelling the
    awaiting task does not stop a call that has started (as with any thread); its result is dropped."""
    if retry_lost:
        fn = _retrying_lost(fn)

    async def call(*args: Any, **kwargs: Any) -> Any:
        return await db_threads().submit(fn, args, kwargs)

    return call


def prepare_hot() -> bool:
    """`prepare=` for the statements every share runs (the pool's INSERT, the screening's read, the
    rules' record): True prepares each once per connection, and `server_binding_cursor` asks for
    generic plans, so PostgreSQL plans it once instead of at every share (planning the INSERT, with
    its arrays and CTEs, is a large share of its PostgreSQL CPU: docs/benchmarks.md, "Pool").
    SAPO_DB_PREPARE=0 turns it off (and the settings then leave psycopg's prepare_threshold at None,
    Django's default for connection poolers)."""
    return bool(settings.SAPO_DB_PREPARE)


def server_binding_cursor() -> AbstractContextManager[psycopg.Cursor]:
    """`with server_binding_cursor() as cursor`: a psycopg cursor on this thread's Django connection
    (opened if needed) whose parameters the server binds: Django's own cursor quotes every parameter
    into the SQL text on the client, which for a share's arrays or a socket's session statement cost
    more CPU than the statement itself (docs/benchmarks.md). Inside Django's transaction.atomic it
    runs in that transaction. It binds `binary_array`'s arrays as they are.

    One cursor per connection, kept on it for its next statements (the `with` does not close it): a
    new one would register the arrays' dumper and look every parameter's dumper up afresh at every
    statement, two statements a share. It holds its last result until its next statement."""
    connection.ensure_connection()
    raw = connection.connection
    if raw not in _generic_plans and connection.get_autocommit() and prepare_hot():
        # Once per connection, outside a transaction (a rolled back one would take the setting with it).
        raw.execute("SET plan_cache_mode = force_generic_plan")
        _generic_plans.add(raw)
    cursor = getattr(raw, "_sapo_cursor", None)  # on the connection: it goes with it
    if cursor is None or cursor.closed:
        cursor = raw._sapo_cursor = psycopg.Cursor(raw)
        cursor.adapters.register_dumper(BinaryArray, _BinaryArrayDumper)
    return nullcontext(cursor)


#: The connections whose prepared statements are planned once (generic plans), as `prepare_hot` means:
#: left to choose, PostgreSQL plans the first five executions of each afresh, and goes on doing so
#: while that plan looks cheaper than the generic one, as it does for the screening's read of a share
#: with few questions: at every share, for more CPU than the read itself (docs/benchmarks.md,
#: "A share's fixed cost"). Set per session, not as a start-up option (PgBouncer refuses start-up
#: options it does not track); it changes nothing but prepared statements' plans, and Django's own
#: queries are never prepared.
_generic_plans: weakref.WeakSet = weakref.WeakSet()


class BinaryArray:
    """A one-dimensional PostgreSQL array already in its binary wire format (`binary_array`)."""

    __slots__ = ("data", "oid")

    def __init__(self, data: bytes, oid: int) -> None:
        self.data, self.oid = data, oid


#: binary_array's element kinds: (sapo_native.pg_array's code, the element type's oid, the array type's).
ARRAY_KINDS = {
    "text": (0, 25, 1009),
    "bytea": (1, 17, 1001),
    "int4": (2, 23, 1007),
    "int8": (3, 20, 1016),
    "bool": (4, 16, 1000),
    "uuid": (5, 2950, 2951),
}


def binary_array(kind: str, values: list) -> BinaryArray | list:
    """`values` (None for NULL) as a parameter of type `kind`[] for a `server_binding_cursor`'s `%(...)b`
    placeholder: encoded in C in one call (common.native) when the extension is there, else the list
    itself, which psycopg dumps element by element in Python, a cost a share's INSERT pays for every
    element of its arrays (docs/benchmarks.md). In C, an element of another type raises TypeError, an
    integer out of range OverflowError, a lone surrogate UnicodeEncodeError."""
    fast = native()
    if fast is None:
        return values
    code, element_oid, array_oid = ARRAY_KINDS[kind]
    return BinaryArray(fast.pg_array(code, element_oid, values), array_oid)


class _BinaryArrayDumper(Dumper):
    """psycopg's Dumper for BinaryArray: the bytes as they are, typed with the array's oid."""

    format = Format.BINARY

    def dump(self, obj: BinaryArray) -> bytes:
        return obj.data

    def get_key(self, obj: BinaryArray, format: Any) -> tuple:
        return (BinaryArray, obj.oid)

    def upgrade(self, obj: BinaryArray, format: Any) -> Dumper:
        dumper = _BinaryArrayDumper(BinaryArray)
        dumper.oid = obj.oid
        return dumper


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
