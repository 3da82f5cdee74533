"""Telling a PostgreSQL connection that a server restart broke from a good one, without a round trip.

A connection kept between calls (common.db's threads keep theirs for minutes, the pool keeps its idle
ones) does not learn that its server went away until it next sends a statement: after a restart, each
one failed the first call it served, up to tens of seconds after the database was back, and the node
whose share or sample that was got `internal_error`. But a server that ends a session (a restart, fast
or immediate, or pg_terminate_backend) sends a last error message and closes the socket, and an idle
connection never has anything else to read (the platform uses no LISTEN): so an idle connection whose
socket is readable is one to throw away. Checking costs one poll() of one descriptor, no round trip.
The pool checks each connection so before handing it out (config.pg_backend), and common.db each
database thread's kept one before every call.
"""

from __future__ import annotations

import select

import psycopg
from psycopg.pq import ConnStatus, TransactionStatus


def connection_lost(raw: psycopg.Connection) -> bool:
    """Whether `raw`, idle, can no longer serve a statement: closed, or its server has hung up (a
    message waiting on an idle connection is the server's farewell). Reads libpq's state directly
    (psycopg's `info` builds an object per read): a few microseconds, most of it the poll()."""
    pgconn = raw.pgconn
    if pgconn.status != ConnStatus.OK:
        return True
    if pgconn.transaction_status != TransactionStatus.IDLE:
        return False  # in a transaction or a statement: its owner is using it, and will see an error
    try:
        poller = select.poll()  # not select(): a busy server has descriptors above FD_SETSIZE
        poller.register(pgconn.socket, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


def finish_if_lost(raw: psycopg.Connection) -> bool:
    """`connection_lost(raw)`, and if so, its socket closed too: whoever holds it (Django, the pool)
    then sees a closed connection, and the pool throws it away instead of keeping it for the next."""
    if not connection_lost(raw):
        return False
    if raw.pgconn.status == ConnStatus.OK:
        raw.pgconn.finish()
    return True


def pool_check(raw: psycopg.Connection) -> None:
    """psycopg_pool's `check` for each connection it hands out (config.pg_backend): raises for a lost
    one, which the pool then throws away (closed) and replaces before serving another."""
    if finish_if_lost(raw):
        raise psycopg.OperationalError("the server ended this pooled connection's session")
