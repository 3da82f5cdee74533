"""Database connections a PostgreSQL restart broke (common.pg_lost, common.db): the sessions the pool
and the database threads hold are ended by the server (pg_terminate_backend, what a fast or
immediate restart does to each), and once the database is back no node gets `internal_error`, no
socket fails to open, and no call fails on a connection kept from before."""

from __future__ import annotations

import asyncio
import copy
import time

import psycopg
import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connection, connections
from node_sockets import ask, open_socket
from support.pool import make_group, share_frame

from common.pg_lost import connection_lost, finish_if_lost

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]


def _own_connection() -> psycopg.Connection:
    """A connection of the test's own, to the test database, outside Django and its pool."""
    s = connection.settings_dict
    return psycopg.connect(
        dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"], host=s["HOST"], port=s["PORT"], autocommit=True
    )


@pytest.fixture
def end_sessions():
    """`end_sessions()`: every session on the test database but the test's own (its Django connection
    and the one that ends them) is ended by the server, as a restart ends them; returns once they are
    all gone, with how many there were. Afterwards asgiref's thread drops its broken connection."""
    _hand_back_kept_connections()
    # A fresh site pool: the one earlier tests used may be lent out whole to threads that keep their
    # connections; Django hands each one back to the pool it came from, so closing it here is safe.
    connection.close_pool()
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        keep = cursor.fetchone()[0]
    killer = _own_connection()

    def end() -> int:
        pids = [
            pid
            for (pid,) in killer.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND pid <> %s",
                [keep],
            )
        ]
        killer.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        deadline = time.monotonic() + 10
        while killer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone()[0]:
            assert time.monotonic() < deadline, "the ended sessions did not go"
            time.sleep(0.02)
        return len(pids)

    yield end
    killer.close()
    _hand_back_kept_connections()


def _hand_back_kept_connections() -> None:
    """The database threads (common.db) and asgiref's thread keep the connections they borrowed from the
    site's pool between calls; after earlier tests they may hold all of it, and after end() they hold
    connections the server ended. Each gives its connection back (the pool drops an ended one)."""
    from common import db

    if db._threads is not None:
        db._threads.close_connections()
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=60)


def test_an_idle_connection_whose_session_the_server_ended_is_lost_without_a_round_trip(end_sessions):
    raw = _own_connection()
    try:
        raw.execute("SELECT 1")
        assert not connection_lost(raw) and not finish_if_lost(raw)
        assert end_sessions() >= 1
        assert connection_lost(raw) and not raw.closed  # psycopg itself does not know yet
        assert finish_if_lost(raw)
        assert raw.closed  # the pool throws a closed connection away rather than keeping it
    finally:
        raw.close()


def test_the_pool_hands_out_no_connection_whose_session_the_server_ended(end_sessions):
    """Connections idle in the pool when the server ended their sessions are thrown away when next
    borrowed (config.pg_backend's check), not handed out to fail their first statement."""
    # A pool of its own, made by the same backend as the site's (another alias, the same settings):
    # the site's pool may be lent out whole to threads earlier tests left holding connections.
    wrapper = type(connections["default"])(copy.deepcopy(connection.settings_dict), alias="lost_connections_test")
    pool = wrapper.pool
    pool.open()  # Django opens it on its first connection
    try:
        idle = [pool.getconn(timeout=30) for _ in range(2)]
        ended = {raw.info.backend_pid for raw in idle}
        for raw in idle:
            pool.putconn(raw)
        assert end_sessions() >= 2
        for _ in range(3):
            with pool.connection(timeout=30) as raw:
                assert raw.execute("SELECT pg_backend_pid()").fetchone()[0] not in ended
    finally:
        wrapper.close_pool()


def test_a_connection_in_a_transaction_is_never_taken_for_lost():
    raw = _own_connection()
    try:
        with raw.transaction():
            raw.execute("SELECT 1")
            assert not connection_lost(raw)
    finally:
        raw.close()


@pytest.fixture
def three_nodes(db):
    from factories import make_node_with_token

    return [make_node_with_token(name=f"n{i}") for i in range(3)]


async def _round(sockets, tag: str) -> list[dict]:
    """Each socket shares a group (all at once), asks for a sample and says hello again: the replies.
    Each share is acknowledged with its group accepted."""
    groups = [make_group(seed=100 + i) for i in range(len(sockets))]
    replies = list(
        await asyncio.gather(
            *(ask(s, share_frame(g, ref=f"{tag}-{i}")) for i, (s, g) in enumerate(zip(sockets, groups, strict=True)))
        )
    )
    assert [r.get("accepted") for r in replies] == [[g["id"]] for g in groups], replies
    for i, socket in enumerate(sockets):
        replies.append(await ask(socket, {"type": "sample", "v": 1, "n": 2, "ref": f"{tag}-sample-{i}"}))
        replies.append(await ask(socket, {"type": "hello", "v": 1, "client": "t", "model": "m", "hardware": "h"}))
    return replies


async def test_no_node_gets_internal_error_once_the_database_is_back(three_nodes, end_sessions):
    sockets = [await open_socket(token, hello=True) for _, token in three_nodes]
    before = await _round(sockets, "before")  # every database thread that served them keeps a connection
    assert [r["type"] for r in before] == ["ack"] * 3 + ["samples", "welcome"] * 3, before

    assert await sync_to_async(end_sessions, thread_sensitive=False)() >= 1  # the database "restarted"

    after = await _round(sockets, "after")
    assert [r["type"] for r in after] == ["ack"] * 3 + ["samples", "welcome"] * 3, after  # no internal_error
    again = await open_socket(three_nodes[0][1], hello=True)  # a socket opens (no 4503)
    await again.disconnect()
    for socket in sockets:
        await socket.disconnect()
