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

    def get() -> T:
        loop = asyncio.get_running_loop()
        value = made.get(loop)
        if value is None:
            value = made[loop] = factory()
        return value

    return get
