"""Node sockets at scale (docs/benchmarks.md, "Sockets"): many sockets opening at once are all
welcomed; one socket's slow database call does not hold up the others (calls run in parallel on
common.db's threads, not on Channels' one sync thread); a frame's bookkeeping costs no database
statement, and the process heartbeat costs the same few statements however many sockets it renews.
Speed itself is measured in bench/sockets.py, not here."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid

import psycopg
import pytest
import websockets
from asgiref.sync import sync_to_async
from django.db import connection
from factories import make_node_with_token, make_user
from node_sockets import ask, open_socket

from common.db import db_call
from nodes import presence
from nodes.models import Node
from sapo_node import protocol

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]

HELLO = protocol.frame(protocol.HELLO, client="sapo-node/test", model="m", hardware="h")


def nodes_with_tokens(count: int) -> list[tuple[Node, str]]:
    out = []
    for start in range(0, count, 10):  # an account holds at most SAPO_NODES_PER_ACCOUNT nodes
        owner = make_user()
        out += [make_node_with_token(owner=owner, name=f"n{i}") for i in range(start, min(count, start + 10))]
    return out


async def welcomed(url: str, token: str):
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None)
    await ws.send(json.dumps(HELLO))
    reply = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
    assert reply["type"] == protocol.WELCOME, reply
    return ws


def test_sixty_sockets_opening_at_once_are_all_welcomed_and_present(live_server):
    nodes = nodes_with_tokens(60)
    url = live_server.ws_url + "/ws/node/"

    async def crowd() -> None:
        sockets = await asyncio.gather(*(welcomed(url, token) for _, token in nodes))
        try:
            counts = await sync_to_async(presence.connection_counts)([node.id for node, _ in nodes])
            assert counts == {node.id: 1 for node, _ in nodes}
        finally:
            await asyncio.gather(*(ws.close() for ws in sockets))

    asyncio.run(crowd())


def test_a_socket_stuck_in_the_database_does_not_hold_up_the_others(live_server):
    """Node A's session cannot open while its row is locked; node B, arriving after it, is welcomed
    meanwhile. On one shared database thread B would queue behind A's blocked call."""
    (stuck, stuck_token), (_, free_token) = nodes_with_tokens(2)
    url = live_server.ws_url + "/ws/node/"
    db = connection.settings_dict
    params = {"dbname": db["NAME"], "user": db["USER"], "password": db["PASSWORD"], "host": db["HOST"]}
    with psycopg.connect(**params, port=db["PORT"] or None) as lock:
        lock.execute("SELECT id FROM nodes_node WHERE id = %s FOR UPDATE", [stuck.id])

        async def race() -> bool:
            first = asyncio.create_task(welcomed(url, stuck_token))
            await asyncio.sleep(1.0)  # A's socket is open and its session UPDATE waits for the lock
            assert not first.done()
            second = await welcomed(url, free_token)
            waiting = not first.done()
            await second.close()
            lock.rollback()  # now A gets its welcome too
            await (await first).close()
            return waiting

        assert asyncio.run(race())


async def test_frames_cost_no_database_statement_for_bookkeeping(node, node_token, statements):
    socket = await open_socket(node_token)
    assert (await ask(socket, HELLO))["type"] == protocol.WELCOME
    statements.clear()
    # The same hello again (a node reconnecting says it each time) and frames refused by the parser:
    # the rate limit is counted, last seen noted for the next beat, and nothing reaches the database.
    for _ in range(10):
        assert (await ask(socket, HELLO))["type"] == protocol.WELCOME
        assert (await ask(socket, {"type": "no-such-type", "v": 1}))["type"] == protocol.ERROR
    assert statements == []
    await socket.disconnect()


async def test_the_heartbeat_costs_the_same_however_many_sockets(statements, settings):
    settings.REDIS_URL = ""  # presence in the database: the heartbeat's statements are counted here
    nodes = await sync_to_async(nodes_with_tokens)(6)

    async def beat_with(count: int) -> int:
        book = presence.SocketBook()
        for node, _ in nodes[:count]:
            book.opened(node_id=node.id, connection_id=uuid.uuid4())
            book.seen(node.id)
        statements.clear()
        await book.beat(renew=True)
        sent = len(statements)
        for connection_id in list(book.sockets):
            book.closed(connection_id)
        return sent

    assert await beat_with(2) == await beat_with(6)
    renewed = await sync_to_async(presence.connected_node_ids)([node.id for node, _ in nodes])
    assert renewed == {node.id for node, _ in nodes}


async def test_database_calls_run_on_several_threads_at_once():
    """Four calls that each wait for the other three: they finish only if they run side by side."""
    together = threading.Barrier(4)

    def meet() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        together.wait(timeout=30)
        return pid

    pids = await asyncio.gather(*(db_call(meet)() for _ in range(4)))
    assert len(set(pids)) == 4  # four connections from the pool, one per thread


def test_the_server_s_start_up_objects_are_out_of_the_collector_s_reach() -> None:
    """config.asgi freezes what start-up made: a full collection then walks only what the sockets
    made since, not the ~200,000 objects of Django, the apps and reasoning-gym (docs/benchmarks.md,
    "What a socket costs")."""
    import gc

    import config.asgi  # noqa: F401  (imported by every way the site is served)

    assert gc.get_freeze_count() > 50_000
