"""sockets.closes: which sockets a close reaches, and a close that arrives while a socket authenticates."""

from __future__ import annotations

from datetime import timedelta

import pytest

from nodes.events import close_event
from sockets import closes as closes_module
from sockets.closes import SocketCloses


class Socket:
    def __init__(self) -> None:
        self.codes: list[int] = []

    def close_for(self, code: int) -> None:
        self.codes.append(code)


def test_a_close_reaches_the_node_s_sockets_or_the_contributor_s_and_no_others() -> None:
    closes = SocketCloses()
    since = closes.clock()
    a1, a2, b, other = Socket(), Socket(), Socket(), Socket()
    assert closes.register(a1, node_id=1, contributor_id=10, since=since) is None
    assert closes.register(a2, node_id=1, contributor_id=10, since=since) is None
    assert closes.register(b, node_id=2, contributor_id=10, since=since) is None
    assert closes.register(other, node_id=3, contributor_id=11, since=since) is None
    closes.deliver(close_event(node_id=1, code=4401, reason="token_revoked"))
    assert (a1.codes, a2.codes, b.codes, other.codes) == ([4401], [4401], [], [])
    closes.deliver(close_event(contributor_id=10, code=4403, reason="banned"))
    assert (a1.codes, a2.codes, b.codes, other.codes) == ([4401, 4403], [4401, 4403], [4403], [])


def test_an_unregistered_socket_is_not_closed_and_leaves_no_entries() -> None:
    closes = SocketCloses()
    socket = Socket()
    closes.register(socket, node_id=1, contributor_id=10, since=closes.clock())
    closes.unregister(socket)
    closes.unregister(socket)  # twice: harmless
    closes.deliver(close_event(node_id=1, code=4401, reason="token_revoked"))
    assert socket.codes == [] and closes.by_node == {} and closes.by_contributor == {} and closes.open_count() == 0


def test_a_close_that_arrived_during_the_socket_s_authentication_is_answered_at_registration() -> None:
    closes = SocketCloses()
    before = closes.clock()
    closes.deliver(close_event(contributor_id=10, code=4403, reason="banned"))
    after = closes.clock() + 1
    # Its call started before the close arrived: it may have read the tables before the ban committed.
    assert closes.register(Socket(), node_id=1, contributor_id=10, since=before) == 4403
    # Its call started after: the ban was committed before the call read the tables (which refused it).
    assert closes.register(Socket(), node_id=1, contributor_id=10, since=after) is None
    # Another contributor's socket is not concerned.
    assert closes.register(Socket(), node_id=2, contributor_id=11, since=before) is None


def test_recent_closes_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(closes_module, "RECENT_MAX", 5)
    closes = SocketCloses()
    for node_id in range(20):
        closes.deliver(close_event(node_id=node_id, code=4401, reason="token_revoked"))
    assert len(closes.recent) == 5


def test_a_close_names_a_node_or_a_contributor() -> None:
    with pytest.raises(ValueError):
        close_event(code=4403, reason="banned")
    with pytest.raises(ValueError):
        close_event(node_id=1, contributor_id=2, code=4403, reason="banned")


class SwarmSocket(Socket):
    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []

    def swarm_changed(self, event: dict) -> None:
        self.told.append(event["state"])


def test_an_order_is_delivered_once_whichever_path_brings_it_first() -> None:
    closes = SocketCloses()
    socket = Socket()
    closes.register(socket, node_id=1, contributor_id=10, since=closes.clock())
    order = {**close_event(node_id=1, code=4401, reason="token_revoked"), "order": 7}
    closes._deliver_once(order)  # the channel layer's
    closes._deliver_once(dict(order))  # the database's read, a moment later
    assert socket.codes == [4401] and len(closes.recent) == 1


def test_a_swarm_change_that_arrived_while_a_socket_read_its_swarm_is_told_at_its_join() -> None:
    closes = SocketCloses()
    before = closes.clock()
    closes.deliver({"type": "swarm.changed", "swarm_id": 3, "slug": "s", "state": "paused", "open": []})
    read_before, read_after, other_swarm = SwarmSocket(), SwarmSocket(), SwarmSocket()
    closes.swarm_join(read_before, 3, since=before)  # may have read the swarm before the pause committed
    closes.swarm_join(read_after, 3, since=closes.clock() + 1)  # read it after: nothing to tell
    closes.swarm_join(other_swarm, 4, since=before)
    assert (read_before.told, read_after.told, other_swarm.told) == (["paused"], [], [])


@pytest.mark.django_db(transaction=True)
def test_an_order_is_written_in_the_change_s_transaction_and_read_back_until_it_is_old() -> None:
    from django.db import transaction
    from django.db.models.functions import Now

    from nodes.events import socket_order, socket_orders_prune, socket_orders_recent
    from nodes.models import SocketOrder

    with pytest.raises(RuntimeError):  # outside a transaction a crash could split it from its change
        socket_order(close_event(node_id=1, code=4401, reason="token_revoked"))
    with transaction.atomic():
        order = socket_order(close_event(node_id=1, code=4401, reason="token_revoked"))
    assert [o["order"] for o in socket_orders_recent()] == [order.id]
    assert socket_orders_recent()[0]["node_id"] == 1
    SocketOrder.objects.filter(id=order.id).update(created_at=Now() - timedelta(days=2))
    assert socket_orders_recent() == []
    assert socket_orders_prune() == 1 and not SocketOrder.objects.exists()
