"""common.loops.per_loop: one object per running event loop."""

from __future__ import annotations

import asyncio
import gc

from common.loops import per_loop


def test_one_object_per_loop_however_often_it_is_asked_for():
    made = []
    get = per_loop(lambda: made.append(object()) or made[-1])

    async def ask() -> list:
        return [get() for _ in range(3)]

    first = asyncio.run(ask())
    second = asyncio.run(ask())
    assert first == [made[0]] * 3 and second == [made[1]] * 3
    assert len(made) == 2 and made[0] is not made[1]


def test_two_loops_asking_in_turn_each_keep_their_own():
    get = per_loop(object)
    loops = [asyncio.new_event_loop() for _ in range(2)]
    try:

        async def ask():
            return get()

        seen = [loops[i % 2].run_until_complete(ask()) for i in range(6)]
        assert seen[0::2] == [seen[0]] * 3 and seen[1::2] == [seen[1]] * 3 and seen[0] is not seen[1]
    finally:
        for loop in loops:
            loop.close()


def test_a_loop_made_after_another_is_gone_gets_a_new_object():
    get = per_loop(object)

    async def ask():
        return get()

    loop = asyncio.new_event_loop()
    old = loop.run_until_complete(ask())
    loop.close()
    del loop
    gc.collect()
    loop = asyncio.new_event_loop()  # may well reuse the dead loop's address
    try:
        assert loop.run_until_complete(ask()) is not old
    finally:
        loop.close()
