"""A node's frame budgets (sockets.ratelimit): token buckets of one minute's allowance, refilled
continuously, in Redis and in-process; and whose share goes first (pool.turns)."""

from __future__ import annotations

import asyncio

import pytest

from pool.turns import Turns
from sockets import ratelimit
from sockets.ratelimit import Budget

pytestmark = pytest.mark.usefixtures("fresh_rate_counts")

T0 = 1_800_000_000.0  # an explicit clock: the buckets take `now`


async def admitted(node: int, budget: Budget, at: float, count: int = 1, size: int = 0, cpu_ms: int = 0) -> int:
    return sum([await ratelimit.admit(node, budget, size=size, cpu_ms=cpu_ms, now=at) for _ in range(count)])


async def test_a_full_minute_is_admitted_at_once_then_the_refill_rate(backend):
    budget = Budget(messages=60, bytes=10**9, cpu_ms=10**9)
    assert await admitted(1, budget, T0, count=70) == 60  # a burst gets the minute's allowance, no more
    # Refused frames count too: the 10 refused took the bucket to -10. At 1 a second it holds a whole
    # message again after 11 s, then admits one frame a second: not the next minute's 60 at once.
    assert await admitted(1, budget, T0 + 10.5) == 0  # 0.5: not a whole message -> -0.5
    assert await admitted(1, budget, T0 + 12.0) == 1  # 1.0 -> 0.0
    assert await admitted(1, budget, T0 + 12.5) == 0
    # After two silent minutes any node has its whole minute again.
    assert await admitted(1, budget, T0 + 200, count=70) == 60


async def test_no_double_minute_across_a_minute_boundary(backend):
    """The fixed window this replaced admitted 2 x the allowance around a minute's end."""
    budget = Budget(messages=60, bytes=10**9, cpu_ms=10**9)
    boundary = (T0 // 60 + 1) * 60
    first = await admitted(2, budget, boundary - 1, count=60)
    second = await admitted(2, budget, boundary + 1, count=60)
    assert (first, second) == (60, 2)  # 2 s of refill, not a new minute


async def test_bytes_are_a_bucket_too_and_a_large_frame_goes_into_debt(backend):
    budget = Budget(messages=10**6, bytes=6000, cpu_ms=10**9)
    assert await admitted(3, budget, T0, size=5000) == 1  # within the minute: admitted
    assert await admitted(3, budget, T0, size=5000) == 0  # 1,000 left; refused, it counts: -4,000
    assert await admitted(3, budget, T0 + 30, size=10) == 0  # 30 s refill 3,000: still -1,000
    assert await admitted(3, budget, T0 + 60, size=10) == 1  # refilled to 1,990
    # A frame larger than a whole minute's bytes needs a full bucket, and leaves the deepest debt.
    small = Budget(messages=10**6, bytes=1000, cpu_ms=10**9)
    assert await admitted(9, small, T0, size=5000) == 1
    assert await admitted(9, small, T0 + 59, size=1) == 0  # -1,000 + 59 s of 1,000 a minute
    assert await admitted(9, small, T0 + 61, size=1) == 1


async def test_cpu_is_charged_after_the_frame_and_delays_the_next_by_the_overspend(backend):
    budget = Budget(messages=10**6, bytes=10**9, cpu_ms=600)  # 10 ms a second
    assert await admitted(4, budget, T0) == 1  # nothing spent yet
    # The previous frame cost 900 ms: charged first, the bucket is at -300, so this frame is refused...
    assert await admitted(4, budget, T0, cpu_ms=900) == 0
    assert await admitted(4, budget, T0 + 29) == 0  # ... until 30 s of refill paid it back
    assert await admitted(4, budget, T0 + 31) == 1
    # A closing socket's last frame is charged without a frame.
    await ratelimit.charge(4, budget, 5000, now=T0 + 31)  # the debt stops at minus the allowance
    assert await admitted(4, budget, T0 + 31 + 59) == 0
    assert await admitted(4, budget, T0 + 31 + 61) == 1


async def test_hundreds_of_frames_at_once_are_all_counted(backend):
    """With Redis, every frame is a command; 1,000 sockets sending at once must wait for connections of
    the bounded pool, not fail with "Too many connections" (redis-py's default pool, past 100)."""
    budget = Budget(messages=10**6, bytes=10**9, cpu_ms=10**9)
    results = await asyncio.gather(*(ratelimit.admit(1000 + i % 50, budget, size=10, now=T0) for i in range(400)))
    assert all(results)


async def test_nodes_have_buckets_of_their_own(backend):
    budget = Budget(messages=3, bytes=10**9, cpu_ms=10**9)
    assert await admitted(5, budget, T0, count=5) == 3
    assert await admitted(6, budget, T0, count=5) == 3


async def test_the_lowest_recent_cpu_goes_first_and_nothing_waits_while_a_slot_is_free():
    turns = Turns(slots=1)
    turns.spent(7, 5.0)  # a node that has cost 5 s of CPU lately
    order: list[str] = []
    release = asyncio.Event()

    async def run(names: list[str]) -> list[str]:
        order.extend(names)
        if names == ["first"]:
            await release.wait()
        return [name.upper() for name in names]

    first = asyncio.create_task(turns.share(7, "first", run))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["first"] and turns.running == 1  # a free slot: no waiting
    heavy = [asyncio.create_task(turns.share(7, f"heavy{i}", run)) for i in range(3)]
    await asyncio.sleep(0)
    light = asyncio.create_task(turns.share(8, "light", run))  # arrives last, has cost nothing
    await asyncio.sleep(0)
    assert turns.waiting == 4
    release.set()
    assert await asyncio.gather(first, *heavy, light) == ["FIRST", "HEAVY0", "HEAVY1", "HEAVY2", "LIGHT"]
    assert order == ["first", "light", "heavy0", "heavy1", "heavy2"]  # then in order of arrival
    assert turns.running == 0 and turns.waiting == 0


async def test_shares_waiting_at_once_go_together_one_per_node_in_turn_order_the_costly_apart():
    turns = Turns(slots=1, together=3)
    turns.spent(9, 5.0)  # two nodes that cost the server 5 s of CPU lately
    turns.spent(10, 5.0)
    batches: list[list[str]] = []
    release = asyncio.Event()

    async def run(names: list[str]) -> list[object]:
        batches.append(names)
        if names == ["first"]:
            await release.wait()
        return [ValueError(name) if name == "refused" else name.upper() for name in names]

    first = asyncio.create_task(turns.share(1, "first", run))
    await asyncio.sleep(0)
    waiting = [
        asyncio.create_task(turns.share(node, name, run, key=key))
        for node, name, key in [
            (9, "heavy", None),  # the most CPU lately: its turn comes last
            (2, "a", None),
            (2, "a-again", None),  # the same node: not twice in one batch
            (3, "refused", None),
            (4, "other-key", "k"),  # another key: not with these
            (5, "b", None),
            (10, "heavy-too", None),
        ]
    ]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(first, *waiting, return_exceptions=True)
    # The light nodes go together, the costly ones together after them: a light node's share never
    # waits for theirs.
    assert batches == [["first"], ["a", "refused", "b"], ["a-again"], ["other-key"], ["heavy", "heavy-too"]]
    assert results[:3] == ["FIRST", "HEAVY", "A"]
    assert isinstance(results[4], ValueError) and str(results[4]) == "refused"  # its own failure, its alone
    assert results[6:] == ["B", "HEAVY-TOO"] and turns.running == 0


async def test_a_batch_is_run_by_one_function_so_shares_for_another_wait_for_their_own():
    turns = Turns(slots=1, together=3)
    release = asyncio.Event()
    runs: list[tuple[str, list[str]]] = []

    def runner(name: str):
        async def run(items: list[str]) -> list[str]:
            runs.append((name, items))
            if items == ["first"]:
                await release.wait()
            return items

        return run

    a, b = runner("a"), runner("b")
    first = asyncio.create_task(turns.share(1, "first", a))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(turns.share(n, f"s{n}", run)) for n, run in [(2, a), (3, b), (4, a)]]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *waiting)
    assert runs == [("a", ["first"]), ("a", ["s2", "s4"]), ("b", ["s3"])]


async def test_a_cancelled_waiter_gives_up_its_place_and_no_slot_is_lost():
    turns = Turns(slots=1, together=2)
    hold = asyncio.Event()
    ran: list[list[str]] = []

    async def run(names: list[str]) -> list[str]:
        ran.append(names)
        await hold.wait()
        return names

    running = asyncio.create_task(turns.share(1, "running", run))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(turns.share(2, "waiting", run))
    await asyncio.sleep(0)
    waiting.cancel()  # its socket closed while it waited
    await asyncio.sleep(0)
    hold.set()
    assert await running == "running"
    assert turns.running == 0 and ran == [["running"]]
    assert await turns.share(3, "next", run) == "next"  # the slot came back


async def test_a_caller_cancelled_while_its_batch_runs_leaves_its_batch_mates_their_results():
    turns = Turns(slots=1, together=2)
    holds = {"first": asyncio.Event(), "leader": asyncio.Event()}
    started: list[list[str]] = []

    async def run(names: list[str]) -> list[str]:
        started.append(names)
        await holds[names[0]].wait()
        return [name.upper() for name in names]

    first = asyncio.create_task(turns.share(1, "first", run))
    await asyncio.sleep(0)
    leader = asyncio.create_task(turns.share(2, "leader", run))
    mate = asyncio.create_task(turns.share(3, "mate", run))
    await asyncio.sleep(0)
    holds["first"].set()
    assert await first == "FIRST"
    await asyncio.sleep(0)
    assert started[-1] == ["leader", "mate"]  # running
    leader.cancel()  # the leader's socket closed
    await asyncio.sleep(0)
    holds["leader"].set()
    assert await mate == "MATE"
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert turns.running == 0


def test_recent_cpu_halves_every_half_life():
    turns = Turns(slots=1, half_life=10.0)
    turns.spent(1, 8.0)
    _, at = turns._spent[1]
    assert turns.recent(1, at + 10) == pytest.approx(4.0)
    assert turns.recent(1, at + 30) == pytest.approx(1.0)
    assert turns.recent(2, at) == 0.0


def test_nodes_whose_recent_cpu_has_decayed_are_forgotten_once_the_table_is_large(monkeypatch):
    from pool import turns as turns_module

    monkeypatch.setattr(turns_module, "SWEEP_ABOVE", 3)
    turns = Turns(slots=1, half_life=1.0)
    for node in (1, 2, 3):
        turns.spent(node, 1.0)
    for node in (1, 2):  # long ago: decayed to nothing
        value, at = turns._spent[node]
        turns._spent[node] = (value, at - 1000)
    turns.spent(4, 1.0)  # the table passes 3: swept
    assert sorted(turns._spent) == [3, 4]
    assert turns.recent(1) == 0.0
