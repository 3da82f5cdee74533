"""The outbox and the WebSocket transport against a stand-in server: delivery exactly once across
lost connections, rejected groups never resent, refusal codes, sampling, and the in-memory pool."""

from __future__ import annotations

import random
import time

import pytest
from fake_pool import FakePool, free_port

from sapo_node import protocol
from sapo_node.groups import Group
from sapo_node.outbox import ACCEPTED, PENDING, REFUSED, REJECTED, Outbox
from sapo_node.tasks import EASY_CATALOGUE, TaskRef
from sapo_node.transport import Hello, MemoryPool, MemoryTransport
from sapo_node.transport.websocket import (
    BACKOFF_MIN,
    BUDGET_SHARE,
    BURST_SECONDS,
    FramePacer,
    WebSocketTransport,
    retry_pause,
)

HELLO = Hello("sapo-node/test", "tiny", "cpu", 2, 2)


def group(i: int, rewards=(1.0, 0.0)) -> Group:
    return Group(
        f"00000000-0000-0000-0000-{i:012d}",
        1,
        TaskRef("basic_arithmetic", 7, i),
        f"q{i}",
        "a",
        ["x"] * len(rewards),
        list(rewards),
    )


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def transports():
    made = []

    def make(url, token="good-token", path=None, **kwargs):
        fast = {"backoff_min": 0.05, "backoff_max": 0.2, "poll_interval": 0.05, "open_timeout": 2}
        t = WebSocketTransport(url, token, path, **(fast | kwargs))
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def peer_pool():
    """A started FakePool offering `count` groups of another node (ids from `first`), its other
    attributes set from the keywords; stopped after the test (after the transports of a test that
    names it before `transports`: a transport closes before its server goes)."""
    started = []

    def make(count, *, first=1000, **attributes):
        pool = FakePool()
        for name, value in attributes.items():
            setattr(pool, name, value)
        pool.sampleable = [{**group(first + i).to_wire(), "node": "peer"} for i in range(count)]
        started.append(pool.start())
        return pool

    yield make
    for pool in started:
        pool.stop()


def test_nodes_dropped_together_retry_spread_out_even_the_first_time():
    rng = random.Random(5)
    pauses = [retry_pause(BACKOFF_MIN, rng) for _ in range(1000)]  # a thousand nodes, one restart
    assert all(0.5 * BACKOFF_MIN <= p <= 1.5 * BACKOFF_MIN for p in pauses)
    assert len({round(p, 2) for p in pauses}) > 90  # spread over the window, not one instant


def test_a_closed_transport_stops_waiting_for_a_server_that_never_answers(tmp_path):
    import socket

    with socket.socket() as silent:  # accepts TCP connections, never completes a WebSocket handshake
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"ws://127.0.0.1:{silent.getsockname()[1]}/ws/node/"
        transport = WebSocketTransport(url, "sapo_x", tmp_path / "outbox.sqlite", open_timeout=300)
        transport.start(Hello(client="t", model="m", hardware="h", local=4, external=4))
        time.sleep(0.5)  # the transport is now waiting for the handshake (up to 300 s)
        transport.close()
        assert not transport._thread.is_alive()  # the attempt was stopped, not waited out
        assert transport.status == "closed"


def test_outbox_keeps_pending_groups_across_reopening(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    box.put([group(1).to_wire(), group(2).to_wire()])
    box.put([group(1).to_wire()])  # the same id again is not a second group
    assert box.mark(group(2).id, REJECTED, "reward_mismatch")
    box.close()
    box = Outbox(tmp_path / "o.sqlite3")
    assert [r["id"] for r in box.pending()] == [group(1).id]
    assert box.counts() == {PENDING: 1, ACCEPTED: 0, REJECTED: 1, REFUSED: 0}
    assert box.rejections() == [(group(2).id, "reward_mismatch")]
    assert not box.mark(group(2).id, ACCEPTED)  # a verdict is final


def test_a_group_shared_while_disconnected_is_delivered_once_after_reconnect(tmp_path, transports):
    port = free_port()
    t = transports(f"ws://127.0.0.1:{port}/ws/node/", path=tmp_path / "o.sqlite3")
    t.start(HELLO)
    no_answer = group(3)
    no_answer.answer = None  # tasks without a single answer share a null ground truth
    t.share([group(1), group(2), no_answer])  # no server yet: the groups wait in the outbox
    assert t.take_external(4) == []
    assert wait_for(lambda: t.status == "retrying")
    pool = FakePool(port=port).start()
    try:
        assert t.wait_connected(10)
        assert t.catalogue() == EASY_CATALOGUE
        assert t.flush(10)
        assert sorted(pool.groups) == sorted(g.id for g in (group(1), group(2), group(3)))
        assert pool.groups[no_answer.id]["answer"] is None
        assert all(len(ids) <= 2 for ids in pool.share_frames)  # welcome.limits are honoured
        assert sum(len(ids) for ids in pool.share_frames) == 3  # each sent once
        assert t.counts().accepted == 3 and t.counts().pending == 0
    finally:
        pool.stop()


def test_a_lost_ack_is_resent_and_the_pool_stores_it_once(tmp_path, transports):
    pool = FakePool().start()
    try:
        pool.drop_next_ack = True
        t = transports(pool.url, path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        t.share([group(1)])
        assert t.flush(10)
        assert pool.share_frames == [[group(1).id], [group(1).id]]  # sent, connection lost, sent again
        assert list(pool.groups) == [group(1).id] and pool.connections == 2
        assert t.counts().accepted == 1
    finally:
        pool.stop()


def test_a_rejected_group_is_logged_and_never_resent(tmp_path, transports):
    pool = FakePool().start()
    try:
        pool.reject[group(1).id] = "reward_mismatch"
        t = transports(pool.url, path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        t.share([group(1)])
        assert t.flush(10)
        pool.kick()  # reconnect: only what is pending may be sent again
        assert wait_for(lambda: pool.connections == 2)
        t.share([group(2)])
        assert t.flush(10)
        sent = [i for ids in pool.share_frames for i in ids]
        assert sent.count(group(1).id) == 1 and sent.count(group(2).id) == 1
        assert t.outbox.rejections() == [(group(1).id, "reward_mismatch")]
        assert (t.counts().accepted, t.counts().rejected) == (1, 1)
    finally:
        pool.stop()


@pytest.mark.parametrize("bad", ["a\x00b", "x\ud800y"], ids=["NUL", "unpaired surrogate"])
def test_a_group_the_server_cannot_store_is_refused_before_sending_and_spares_its_frame_mates(
    tmp_path, transports, bad
):
    # A model's decoded text may hold a NUL or a lone surrogate: the server refuses a frame holding one
    # whole, and its frame-mates would then be sent again one by one.
    pool = FakePool().start()
    try:
        t = transports(pool.url, path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        odd = group(2)
        odd.completions[1] = bad
        t.share([group(1), odd, group(3)])
        assert t.flush(10)
        assert pool.share_frames == [[group(1).id, group(3).id]]
        # Refused by the node itself, counted apart: the pool rejected nothing.
        assert t.outbox.refusals() == [(odd.id, "invalid_message")] and t.outbox.rejections() == []
        assert (t.counts().accepted, t.counts().rejected, t.counts().refused) == (2, 0, 1)
    finally:
        pool.stop()


def test_pending_groups_survive_a_restart_of_the_node(tmp_path, transports):
    port = free_port()
    first = transports(f"ws://127.0.0.1:{port}/ws/node/", path=tmp_path / "o.sqlite3")
    first.start(HELLO)
    first.share([group(1)])
    first.close()
    pool = FakePool(port=port).start()
    try:
        second = transports(pool.url, path=tmp_path / "o.sqlite3")
        second.start(HELLO)
        assert second.flush(10)
        assert list(pool.groups) == [group(1).id]
    finally:
        pool.stop()


def test_a_busy_server_refusing_the_upgrade_403_is_retried_not_taken_for_a_ban(tmp_path, transports):
    pool = FakePool().start()
    pool.busy_upgrades = 3  # daphne's answer when the application did not accept in time
    try:
        t = transports(pool.url, path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        assert t.wait_connected(10)
        assert pool.busy_upgrades == 0 and t.status == "connected"
    finally:
        pool.stop()


@pytest.mark.parametrize("code", [4401, 4403])
def test_a_refused_node_stops_retrying_and_trains_in_silo(tmp_path, transports, code):
    pool = FakePool(close_code=code).start()
    try:
        t = transports(pool.url, path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        assert wait_for(lambda: t.status.startswith("refused"))
        assert str(code) in t.status
        time.sleep(0.3)
        assert pool.connections == 0 and t._thread is not None and not t._thread.is_alive()
        t.share([group(1)])  # still safe to call
        assert t.take_external(2) == [] and not t.flush(0.1)
    finally:
        pool.stop()


def test_a_server_that_cannot_open_a_session_is_retried_with_a_growing_pause(tmp_path, transports):
    """Close 4503 (the server's database or Redis is down) is no refusal: the node comes back, each
    pause about twice the one before (jitter 0.5-1.5) up to backoff_max, and trains meanwhile."""
    pool = FakePool(close_code=protocol.CLOSE_TRY_AGAIN).start()
    try:
        t = transports(pool.url, path=tmp_path / "o.sqlite3", backoff_min=0.1, backoff_max=0.8)
        t.start(HELLO)
        t.share([group(1)])
        assert wait_for(lambda: len(pool.closed_at) >= 5, timeout=20)
        assert not t.status.startswith("refused")
        gaps = [b - a for a, b in zip(pool.closed_at, pool.closed_at[1:], strict=False)][:4]
        # the pauses drawn were 0.1, 0.2, 0.4 and 0.8 s times 0.5-1.5: the last two are at least 0.2 and 0.4
        assert gaps[2] >= 0.19 and gaps[3] >= 0.39, gaps
        assert t.counts().pending == 1  # kept for when the server can take it
        pool.close_code = None
        assert t.flush(10)
        assert list(pool.groups) == [group(1).id]
    finally:
        pool.stop()


def test_a_bad_token_is_refused(tmp_path, transports):
    pool = FakePool().start()
    try:
        t = transports(pool.url, token="wrong", path=tmp_path / "o.sqlite3")
        t.start(HELLO)
        assert wait_for(lambda: t.status == "refused (4401)")
    finally:
        pool.stop()


def test_sampled_groups_are_buffered_validated_and_reported(tmp_path, transports):
    pool = FakePool().start()
    try:
        good = {**group(5).to_wire(), "node": "peer"}
        malformed = {**group(6).to_wire(), "rewards": [1.0]}  # lengths differ
        pool.sampleable = [good, malformed]
        t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=4)
        t.start(HELLO)
        assert wait_for(lambda: len(t._buffer) == 1)
        (got,) = t.take_external(4)
        assert got.id == good["id"] and got.node == "peer"
        t.report({"round": 1, "reward_mean": 0.5, "used": [got.id]})
        assert wait_for(lambda: pool.reports)
        assert pool.reports[0]["used"] == [got.id]
    finally:
        pool.stop()


def test_memory_pool_is_idempotent_and_never_returns_a_nodes_own_groups():
    pool = MemoryPool(EASY_CATALOGUE)
    a, b = MemoryTransport(pool, "a"), MemoryTransport(pool, "b")
    a.share([group(1), group(2, rewards=(1.0, 1.0))])
    a.share([group(1)])
    assert len(pool.groups) == 2 and a.take_external(5) == []
    taken = b.take_external(5)
    assert [g.id for g in taken] == [group(1).id] and taken[0].node == "a"  # the all-equal group is not served


def test_a_thin_pool_is_not_flooded_with_sample_requests(tmp_path, peer_pool, transports):
    pool = peer_pool(1, first=7)  # the node wants 8, the pool has 1
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=8)
    t.start(HELLO)
    assert t.wait_connected(10)
    time.sleep(1.0)
    assert 1 <= pool.sample_requests <= 6  # poll_interval 0.05 s, 5x slower when the pool cannot fill
    assert [g.id for g in t.take_external(8)] == [group(7).id]  # and the same group is not taken twice


@pytest.mark.parametrize(
    ("typed", "endpoint"),
    [
        ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000/ws/node/"),
        ("https://sapo.example.org/", "wss://sapo.example.org/ws/node/"),
        ("http://localhost:8000", "ws://localhost:8000/ws/node/"),
        ("wss://sapo.example.org/ws/node/", "wss://sapo.example.org/ws/node/"),
    ],
)
def test_the_server_address_a_user_types_becomes_the_node_endpoint(typed, endpoint):
    from sapo_node.transport import node_endpoint

    assert node_endpoint(typed) == endpoint


@pytest.mark.parametrize("typed", ["127.0.0.1:8000", "ftp://host/", "ws://"])
def test_a_server_address_that_is_not_a_web_address_is_refused(typed):
    from sapo_node.transport import node_endpoint

    with pytest.raises(ValueError, match="--server"):
        node_endpoint(typed)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_frames_are_paced_below_the_announced_budget_after_a_burst():
    clock = Clock()
    pacer = FramePacer(clock)
    assert pacer.delay(10**9) == 0  # no limits yet (before the welcome): nothing to pace
    pacer.configure({"max_messages_per_minute": 60, "max_bytes_per_minute": 6_000_000})
    rate = BUDGET_SHARE * 60 / 60  # frames a second
    burst = int(rate * BURST_SECONDS)
    for _ in range(burst):
        assert pacer.delay(100) == 0
        pacer.spend(100)
    assert pacer.delay(100) == pytest.approx(1 / rate)
    clock.now += 1 / rate
    assert pacer.delay(100) == pytest.approx(0, abs=1e-9)
    pacer.spend(100)
    # Over a minute, at most the budget's share goes out (plus the first burst).
    sent, start = 0, clock.now
    while clock.now < start + 60:
        wait = pacer.delay(100)
        if wait > 0:
            clock.now += wait
            continue
        pacer.spend(100)
        sent += 1
    assert sent <= BUDGET_SHARE * 60 + 1


def test_bytes_are_paced_too_and_a_frame_larger_than_the_burst_waits_for_a_full_bucket():
    clock = Clock()
    pacer = FramePacer(clock)
    pacer.configure({"max_messages_per_minute": 10_000, "max_bytes_per_minute": 60_000})
    byte_rate = BUDGET_SHARE * 60_000 / 60
    pacer.spend(int(byte_rate * BURST_SECONDS))  # the burst of bytes, spent
    assert pacer.delay(800) == pytest.approx(1.0)
    huge = 10**6  # more than the bucket holds: it goes when the bucket is full again
    assert pacer.delay(huge) == pytest.approx(BURST_SECONDS)
    clock.now += BURST_SECONDS
    assert pacer.delay(huge) == pytest.approx(0, abs=1e-9)


def test_reports_queued_meanwhile_go_as_one_with_the_newest_figures_and_every_used_id(tmp_path):
    t = WebSocketTransport("ws://127.0.0.1:9/ws/node/", "token", tmp_path / "outbox.sqlite3")
    try:
        t.limits["max_used_per_report"] = 4
        t.report({"round": 1, "reward_mean": 0.1, "used": ["a", "b"]})
        t.report({"round": 2, "reward_mean": 0.2, "used": ["b", "c"]})
        t.report({"round": 3, "reward_mean": 0.3, "used": ["d", "e", "f"]})
        first = t._merged_report()
        assert first == {"round": 3, "reward_mean": 0.3, "used": ["a", "b", "c", "d"]}
        assert t._merged_report() == {"round": 3, "reward_mean": 0.3, "used": ["e", "f"]}  # the ids past the cap
        assert not t._reports
        t.report({"round": 4, "reward_mean": 0.4})
        assert t._merged_report() == {"round": 4, "reward_mean": 0.4}  # no ids: none added
    finally:
        t.close()


def test_a_round_that_drains_the_buffer_gets_it_refilled_before_the_next_poll(tmp_path, peer_pool, transports):
    pool = peer_pool(200, first=100, serve_once=True)
    # A poll interval far longer than the test: only a drained buffer can bring the next request.
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=8, poll_interval=30.0)
    t.start(HELLO)
    assert wait_for(lambda: len(t._buffer) == 8)
    taken = []
    for _ in range(6):  # six rounds, each taking 4, faster than one poll interval
        assert wait_for(lambda: len(t._buffer) >= 4, timeout=5)
        taken += t.take_external(4)
    assert len({g.id for g in taken}) == 24  # three buffers' worth, all within one poll interval


def test_a_node_whose_rounds_outrun_its_sample_frames_asks_for_more_groups_per_frame(tmp_path, peer_pool, transports):
    """A small model on a fast machine: rounds of 4 external groups every 50 ms, 60 frames a minute
    (paced to 48, a burst of 8). A buffer of 8 refilled 8 at a time brings at most ~110 groups in 6 s
    (8 groups a frame: the burst, then one frame every 1.25 s); once the burst is spent, asking for more
    per frame as rounds find the buffer short brings most of what they take."""
    limits = {"max_messages_per_minute": 60, "max_bytes_per_minute": 10**8, "max_sample_n": 64}
    pool = peer_pool(1000, serve_once=True, limits=limits)
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=8, poll_interval=30.0)
    t.start(HELLO)
    assert wait_for(lambda: len(t._buffer) == 8)
    taken = []
    for _ in range(120):
        taken += t.take_external(4)
        time.sleep(0.05)
    assert len({g.id for g in taken}) == len(taken) >= 200, pool.sample_sizes
    assert pool.sample_requests <= 8 + 6  # the frame budget holds: the burst and what refilled
    assert 8 < max(pool.sample_sizes) <= 64  # grown as rounds drained the buffer, up to max_sample_n


def test_a_buffer_bounded_by_max_buffer_size_does_not_grow(tmp_path, peer_pool, transports):
    """The experiment runner's nodes train on the pool as it was after their previous turn: their
    buffer stays J groups however fast their rounds drain it."""
    pool = peer_pool(1000, serve_once=True)
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=4, max_buffer_size=4, poll_interval=30.0)
    t.start(HELLO)
    for _ in range(10):
        assert wait_for(lambda: len(t._buffer) == 4)
        assert len(t.take_external(4)) == 4
    assert pool.sample_sizes and set(pool.sample_sizes) == {4}


def test_replies_repeating_a_few_groups_already_seen_do_not_slow_sampling(tmp_path, peer_pool, transports):
    """Uniform draws from a pool a node has partly seen repeat some groups: a reply with most of its
    groups new is not a thin pool (which would wait five poll intervals), and the rounds keep getting
    groups."""
    pool = peer_pool(1000, serve_step=5)  # each reply of 8: 3 groups of the previous reply, 5 new
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=8, max_buffer_size=8, poll_interval=30.0)
    t.start(HELLO)
    assert wait_for(lambda: len(t._buffer) == 8)
    taken = []
    for _ in range(20):
        assert wait_for(lambda: len(t._buffer) >= 4, timeout=5)
        taken += t.take_external(4)
    assert len({g.id for g in taken}) == len(taken) == 80


def test_a_thin_pool_is_not_asked_again_when_the_buffer_drains(tmp_path, peer_pool, transports):
    pool = peer_pool(1, first=7)  # the node wants 8, the pool has 1
    t = transports(pool.url, path=tmp_path / "o.sqlite3", buffer_size=8, poll_interval=30.0)
    t.start(HELLO)
    assert wait_for(lambda: len(t._buffer) == 1)
    assert [g.id for g in t.take_external(4)] == [group(7).id]
    time.sleep(0.5)
    assert pool.sample_requests == 1  # the reply was short: the next request waits for its poll
    assert t.target == 8  # and a round that came up short does not ask for more per request
