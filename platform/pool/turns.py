"""Whose share runs next, and with whom: at most a few batches of shares of one server process verify
and insert at once; a waiting share goes before those of nodes that have lately cost the server more
CPU, and shares that wait at the same time go together.

Why turns: a share's work (verification, moderation, the insert) is Python, and Python runs one
thread at a time. With every socket's share on its own database thread, eight nodes sending a share
ten times a second each share the interpreter with an honest node's share, which then takes as long
as all of theirs together (docs/benchmarks.md, "Attacks on verification"). Here a share waits for a turn instead; turns go in order of the nodes'
recent CPU (each node's CPU seconds, decaying with a half-life of HALF_LIFE_SECONDS), so a node
that sends little waits for at most the shares already running, whatever the others send, and the
nodes that send the most wait for each other. Nothing is refused here: that is the budgets' work
(sockets.ratelimit); a socket handles one frame at a time, so at most one share per socket waits.

Why together: a share costs the server and PostgreSQL about as much again whatever it holds (its
statements, their planning and start-up, the commit: docs/benchmarks.md, "A share's fixed cost").
When a turn comes free, the waiting share whose turn it is takes up to SAPO_SHARE_BATCH - 1 more
waiting shares of other nodes with it (the next in the same order), and they are stored in one
transaction (pool.ingest.rollout_share_batch): with one share waiting, or none, nothing changes;
under load, the fixed cost is paid once per batch. Only nodes that cost about as little lately ride
along (recent CPU at most RIDE_RATIO times the first's, or RIDE_FLOOR): a node that shares little
still waits for at most the shares already running and its own, not for those of the nodes that
cost the most, which go together among themselves.

SAPO_SHARE_SLOTS (default 2) batches run at once: one can wait for PostgreSQL while another computes.
One table per process and event loop; several server processes each order their own sockets.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from common.loops import per_loop

HALF_LIFE_SECONDS = 10.0
#: Nodes remembered before the table is swept of those whose recent CPU has decayed to nothing.
SWEEP_ABOVE = 10_000
#: A waiting share rides with the one whose turn it is when its node's recent CPU is at most RIDE_RATIO
#: times that node's, or at most RIDE_FLOOR seconds (nodes that cost that little are alike).
RIDE_RATIO = 2.0
RIDE_FLOOR = 0.05


@dataclass(eq=False)
class _Waiting:
    node_id: int
    item: Any
    key: Hashable  # shares go together only with shares of the same key
    run: Callable[[list[Any]], Awaitable[list[Any]]]
    future: asyncio.Future[Any]

    def goes_with(self, first: _Waiting) -> bool:
        """Whether this share may go in `first`'s batch, which `first.run` runs: the same key, the same run."""
        return self.key == first.key and self.run == first.run


class Turns:
    def __init__(self, slots: int, half_life: float = HALF_LIFE_SECONDS, together: int = 1) -> None:
        if slots < 1 or together < 1:
            raise ValueError("at least one slot, and at least one share a batch")
        self.slots = slots
        self.together = together
        self.running = 0
        self._decay = math.log(2) / half_life
        self._waiting: list[tuple[float, int, _Waiting]] = []
        self._order = itertools.count()
        self._spent: dict[int, tuple[float, float]] = {}  # node id -> (decayed CPU seconds, when)
        self._sweep_above = SWEEP_ABOVE  # table size that triggers the next sweep of decayed nodes
        self._batches: set[asyncio.Task[None]] = set()  # running (held here: the loop keeps weak references)

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
        return sum(1 for *_, waiting in self._waiting if not waiting.future.done())

    async def share(
        self, node_id: int, item: Any, run: Callable[[list[Any]], Awaitable[list[Any]]], *, key: Hashable = None
    ) -> Any:
        """`item`'s result from `run`, called with a list of items (this one, and others waiting with it:
        of other nodes, of the same `key`) and returning a result per item, in order: a value, or an
        exception that is raised to that item's caller. Runs at once when a slot is free; else waits
        for a turn. Cancelling the caller drops its item while it waits, and its result once running
        (the batch's work goes on: the others' results depend on it)."""
        waiting = _Waiting(node_id, item, key, run, asyncio.get_running_loop().create_future())
        if self.running < self.slots:
            self.running += 1
            self._start([waiting])
        else:
            heapq.heappush(self._waiting, (self._rank(node_id), next(self._order), waiting))
        return await waiting.future

    def _start(self, batch: list[_Waiting]) -> None:
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run(self, batch: list[_Waiting]) -> None:
        try:
            results = await batch[0].run([w.item for w in batch])
        except asyncio.CancelledError:  # the loop is closing
            for w in batch:
                w.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the callers' to see, each of them
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
        else:
            for w, result in zip(batch, results, strict=True):
                if w.future.done():  # its caller was cancelled
                    continue
                if isinstance(result, BaseException):
                    w.future.set_exception(result)
                else:
                    w.future.set_result(result)
        finally:
            self._release()

    def _release(self) -> None:
        """The slot goes to the next batch of waiting shares, or back."""
        batch = self._next_batch()
        if batch:
            self._start(batch)  # `running` counts it already
        else:
            self.running -= 1

    def _next_batch(self) -> list[_Waiting]:
        """The waiting share whose turn it is, and up to `together` - 1 more in turn order, each of a
        node of its own, of the first's key and run, and costing about as little lately (`RIDE_RATIO`; those
        passed over keep their places)."""
        batch: list[_Waiting] = []
        nodes: set[int] = set()
        passed: list[tuple[float, int, _Waiting]] = []
        now = time.monotonic()
        ceiling = math.inf
        while self._waiting and len(batch) < self.together:
            entry = heapq.heappop(self._waiting)
            waiting = entry[2]
            if waiting.future.done():  # its caller was cancelled while it waited
                continue
            if batch and self.recent(waiting.node_id, now) > ceiling:
                passed.append(entry)  # the rest cost more still (the heap is in order of recent CPU)
                break
            if waiting.node_id in nodes or (batch and not waiting.goes_with(batch[0])):
                passed.append(entry)
                continue
            if not batch:
                ceiling = max(RIDE_RATIO * self.recent(waiting.node_id, now), RIDE_FLOOR)
            batch.append(waiting)
            nodes.add(waiting.node_id)
        for entry in passed:
            heapq.heappush(self._waiting, entry)
        return batch


_turns = per_loop(lambda: Turns(settings.SAPO_SHARE_SLOTS, together=settings.SAPO_SHARE_BATCH))


def share_turns() -> Turns:
    """This event loop's table (one per server process; tests run several loops)."""
    return _turns()
