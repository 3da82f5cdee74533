"""One object per running asyncio event loop: a server process has one loop, tests run several (and
an object holding tasks, futures or asyncio clients belongs to the loop that made it)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def per_loop(factory: Callable[[], T]) -> Callable[[], T]:
    """A function returning the running loop's `factory()`, made on the first call in that loop.
    Keyed by the loop object itself, not id(loop): an id can be reused by a later loop (or a forked
    process's new loop) and would hand it an object bound to a dead loop."""
    made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()
    # The last loop asked about and its object: a server asks from one loop, thousands of times a
    # second, and a WeakKeyDictionary lookup makes a weak reference each time.
    last: list = [lambda: None, None]  # [weak reference to the loop, its object]

    def get() -> T:
        loop = asyncio.get_running_loop()
        if last[0]() is loop:
            return last[1]
        value = made.get(loop)
        if value is None:
            value = made[loop] = factory()
        last[:] = [weakref.ref(loop), value]
        return value

    return get
