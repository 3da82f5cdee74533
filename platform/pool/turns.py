"""Whose share runs next: at most a few shares of one server process verify and insert at once, and a
waiting share goes before those of nodes that have lately cost the server more CPU.

Why: a share's work (verification, moderation, the insert) is Python, and Python runs one thread at
a time. With every socket's share on its own database thread, eight nodes sending a share ten
times a second each share the interpreter with an honest node's share, which then takes as long as
all of theirs together (docs/benchmarks.md, "Attacks on verification": an honest share's p50 went
from 12 ms to 60-90 ms). Here a share waits for a turn instead; turns go in order of the nodes'
recent CPU (each node's CPU seconds, decaying with a half-life of HALF_LIFE_SECONDS), so a node
that sends little waits for at most the shares already running, whatever the others send, and the
nodes that send the most wait for each other. Nothing is refused here: that is the budgets' work
(pool.ratelimit); a socket handles one frame at a time, so at most one share per socket waits.

SAPO_SHARE_SLOTS (default 2) shares run at once: one can wait for PostgreSQL while another computes.
One table per process and event loop; several server processes each order their own sockets.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from django.conf import settings

from common.loops import per_loop

HALF_LIFE_SECONDS = 10.0
#: Nodes remembered before the table is swept of those whose recent CPU has decayed to nothing.
SWEEP_ABOVE = 10_000


class Turns:
    def __init__(self, slots: int, half_life: float = HALF_LIFE_SECONDS) -> None:
        if slots < 1:
            raise ValueError("at least one slot")
        self.slots = slots
        self.running = 0
        self._decay = math.log(2) / half_life
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._spent: dict[int, tuple[float, float]] = {}  # node id -> (decayed CPU seconds, when)
        self._sweep_above = SWEEP_ABOVE  # table size that triggers the next sweep of decayed nodes

    def recent(self, node_id: int, now: float | None = None) -> float:
        """The node's CPU seconds here, each weighted by 2^-(its age / half-life)."""
        value, at = self._spent.get(node_id, (0.0, 0.0))
        now = time.monotonic() if now is None else now
        return value * math.exp(-self._decay * max(0.0, now - at))

    def spent(self, node_id: int, cpu_seconds: float) -> None:
        """Add what one of the node's frames cost."""
        now = time.monotonic()
        self._spent[node_id] = (self.recent(node_id, now) + cpu_seconds, now)
        if len(self._spent) > self._sweep_above:  # forget nodes whose weight has decayed to nothing
            for node in [n for n in self._spent if self.recent(n, now) < 1e-6]:
                del self._spent[node]
            # With that many nodes still active, sweep again only once the table has doubled: a sweep
            # on every frame would cost the whole table each time.
            self._sweep_above = max(SWEEP_ABOVE, 2 * len(self._spent))

    def _rank(self, node_id: int) -> float:
        """Orders nodes as `recent` does at any one moment, but does not change with time: recent(t) =
        v * exp(-decay * (t - at)), so comparing log(v) + decay * at compares them at every t. Two
        waits of one node with no frame between rank equal (then first come, first served)."""
        value, at = self._spent.get(node_id, (0.0, 0.0))
        return math.log(value) + self._decay * at if value > 0 else -math.inf

    @property
    def waiting(self) -> int:
        return sum(1 for *_, future in self._waiting if not future.done())

    @asynccontextmanager
    async def turn(self, node_id: int) -> AsyncIterator[None]:
        """Wait for a slot (none waits when one is free), hold it for the block."""
        if self.running < self.slots:
            self.running += 1
        else:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (self._rank(node_id), next(self._order), future))
            try:
                await future  # the slot is handed over by _release: `running` already counts it
            except asyncio.CancelledError:
                if future.done() and not future.cancelled():  # handed over as it was cancelled: pass it on
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():  # a cancelled waiter's future is done: skip it
                future.set_result(None)
                return
        self.running -= 1


_turns = per_loop(lambda: Turns(settings.SAPO_SHARE_SLOTS))


def share_turns() -> Turns:
    """This event loop's table (one per server process; tests run several loops)."""
    return _turns()
