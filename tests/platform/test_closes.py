"""pool.closes: which sockets a close reaches, and a close that arrives while a socket authenticates."""

from __future__ import annotations

import pytest

from nodes.events import close_event
from pool import closes as closes_module
from pool.closes import SocketCloses


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
