"""Carrying out socket orders (nodes.events: closes, swarms' changes) on one process's open sockets.

nodes.events writes each order in the transaction that makes its change and, once that commits, sends
it to CLOSES_GROUP on the channel layer. Each process (each event loop) has one `SocketCloses`, which
keeps its open sockets by node, by contributor and by swarm and delivers every order to them once,
whichever path brings it first:
- the channel layer: the process joins CLOSES_GROUP once, and again every REJOIN_SECONDS (the
  membership lives only in Redis, which can lose it: a restart without persistence, a failover to an
  empty replica, eviction; the layer itself forgets it a day after it was added);
- the database: every settings.SAPO_SOCKET_ORDERS_SECONDS the process reads the recent orders
  (nodes.events.socket_orders_recent) and delivers those it has not. So an order reaches every socket
  within that many seconds whatever Redis does, including while it is down; a socket opens whether or not
  the process could join the group.

A socket opening is authenticated by one database call (sockets.opening: shared with the sockets opening
with it, nodes.sessions.nodes_sessions_open) and then registered here, on the event loop, with no
await in between. A close that committed after that call read the tables reaches this process either
before the socket registers or after:
- after: the socket is registered, and the close closes it;
- before: the close is remembered (`recent`, for RECENT_SECONDS), and `register` answers its code for
  a socket whose call started before the close arrived.
A close that arrived before the call started was committed before the call read the tables, which then
refused the token or saw the ban. So no close is missed however the two interleave. (A socket whose
call started before a close of its *other*, revoked token arrived is closed too, with 4401: it
reconnects, and is authenticated again.) A swarm's change is remembered the same way (`swarm_news`), for
a socket whose swarm was read before the change arrived and which joins it after.

Before the first socket of a process opens, the process reads the orders already made and counts them
as delivered: a socket opening from then on is authenticated, and reads its swarm, after them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from common import outage
from common.db import db_call
from common.loops import per_loop
from nodes.events import (
    CLOSES_GROUP,
    CLOSES_REJOIN_SECONDS,
    NODE_PAUSED,
    ORDER_KEY,
    ORDERS_LOOKBACK_SECONDS,
    socket_orders_prune,
    socket_orders_recent,
)
from sapo_node import protocol
from sockets.swarm_places import SWARM_CHANGED, place_forget, places_forget

logger = logging.getLogger(__name__)

#: How long a close is remembered for sockets whose authentication was in flight when it arrived:
#: longer than any database call takes.
RECENT_SECONDS = 600.0
#: At most this many closes are remembered (a burst of bans cannot grow it without bound).
RECENT_MAX = 100_000
#: Seconds between two joins of CLOSES_GROUP (one ZADD to Redis: the longest the fast path is out
#: after Redis lost the membership).
REJOIN_SECONDS = CLOSES_REJOIN_SECONDS
#: How long an order's id is kept as delivered: past it, the database's reads no longer return it.
DELIVERED_SECONDS = ORDERS_LOOKBACK_SECONDS + 120.0
#: Seconds between two deletions of old orders by each process.
PRUNE_SECONDS = 3600.0


class Closable(Protocol):
    def close_for(self, code: int) -> None: ...

    def swarm_changed(self, event: dict[str, Any]) -> None: ...

    def node_paused(self, paused: bool) -> None: ...


class SocketCloses:
    """One event loop's open node sockets, and the orders delivered to them."""

    def __init__(self) -> None:
        self.by_node: dict[int, set[Closable]] = {}
        self.by_contributor: dict[int, set[Closable]] = {}
        self.where: dict[Closable, tuple[int, int]] = {}
        self.by_swarm: dict[int, set[Closable]] = {}
        self.swarm_of: dict[Closable, int] = {}
        # (arrived at, node id, contributor id, code), oldest first
        self.recent: collections.deque[tuple[float, int | None, int | None, int]] = collections.deque()
        # swarm id -> (arrived at, its latest change)
        self.swarm_news: dict[int, tuple[float, dict[str, Any]]] = {}
        # node id -> (arrived at, paused), oldest first: the nodes paused or resumed lately
        self.pause_news: collections.OrderedDict[int, tuple[float, bool]] = collections.OrderedDict()
        # order id -> when it was delivered, oldest first
        self.delivered: collections.OrderedDict[int, float] = collections.OrderedDict()
        self.ready: asyncio.Future | None = None
        self.tasks: set[asyncio.Task] = set()

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    async def listen(self) -> None:
        """Start following the orders if this process has not yet: the first socket waits for the read of
        the orders already made (a failure, the database down, is raised, and the next socket tries again)
        and for one try at joining CLOSES_GROUP (a failure there is the database path's to make up for)."""
        if self.ready is None or (self.ready.done() and self.ready.exception() is not None):
            self.ready = asyncio.get_running_loop().create_future()
            self._spawn(self._follow(self.ready))
        await asyncio.shield(self.ready)

    async def _follow(self, ready: asyncio.Future) -> None:
        try:
            for order in await db_call(socket_orders_recent, retry_lost=True)():
                self._delivered(order[ORDER_KEY])
        except Exception as exc:
            ready.set_exception(exc)
            ready.exception()  # retrieved: the sockets waiting on it raise it themselves
            return
        layer = get_channel_layer()
        if layer is not None:
            channel = await layer.new_channel()
            await self._join(layer, channel)
            self._spawn(self._receive(layer, channel))
            self._spawn(self._keep_joined(layer, channel))
        ready.set_result(None)
        await self._read_orders()

    async def _read_orders(self) -> None:
        """Every SAPO_SOCKET_ORDERS_SECONDS, deliver the orders the channel layer did not bring."""
        pruned = self.clock()
        while True:
            await asyncio.sleep(settings.SAPO_SOCKET_ORDERS_SECONDS)
            try:
                orders = await db_call(socket_orders_recent, retry_lost=True)()
                if self.clock() - pruned >= PRUNE_SECONDS:
                    pruned = self.clock()
                    await db_call(socket_orders_prune)()
            except Exception as exc:  # the database is down: no order can be made either
                if not outage.dependency_failed(exc):
                    logger.exception("reading the socket orders failed")
                continue
            outage.DATABASE.answered()
            for order in orders:
                self._deliver_once(order)

    async def _join(self, layer: Any, channel: str) -> None:
        try:
            await layer.group_add(CLOSES_GROUP, channel)
        except Exception as exc:  # the layer is down: again at the next turn
            if not outage.dependency_failed(exc):
                logger.exception("joining %s failed", CLOSES_GROUP)
        else:
            outage.REDIS.answered()

    async def _receive(self, layer: Any, channel: str) -> None:
        while True:
            try:
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the layer is down: try again in a moment
                if not outage.dependency_failed(exc):
                    logger.exception("receiving socket orders failed")
                await asyncio.sleep(1.0)
                continue
            self._deliver_once(event)

    async def _keep_joined(self, layer: Any, channel: str) -> None:
        # Within half the layer's group expiry too (a layer forgets a membership that long after it was added).
        every = min(REJOIN_SECONDS, max(1.0, getattr(layer, "group_expiry", 86_400) / 2))
        while True:
            await asyncio.sleep(every)
            await self._join(layer, channel)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _delivered(self, order_id: Any) -> bool:
        """Count the order as delivered; False when it already was."""
        if not isinstance(order_id, int):
            return True
        if order_id in self.delivered:
            return False
        now = self.clock()
        self.delivered[order_id] = now
        while self.delivered and next(iter(self.delivered.values())) < now - DELIVERED_SECONDS:
            self.delivered.popitem(last=False)
        return True

    def _deliver_once(self, event: Any) -> None:
        if not isinstance(event, dict) or not self._delivered(event.get(ORDER_KEY)):
            return
        try:
            self.deliver(event)
        except Exception:
            logger.exception("a socket order could not be delivered: %r", event)

    def deliver(self, event: dict[str, Any]) -> None:
        """A close from nodes.events: close this process's matching sockets, and remember it. A swarm's
        change (sockets.swarm_places): tell this process's sockets of that swarm."""
        if event.get("type") == SWARM_CHANGED:
            self._swarm_changed(event)
            return
        if event.get("type") == NODE_PAUSED:
            self._node_paused(event)
            return
        code = event.get("code")
        code = code if isinstance(code, int) else protocol.CLOSE_UNAUTHENTICATED
        node_id, contributor_id = event.get("node_id"), event.get("contributor_id")
        now = self.clock()
        self.recent.append((now, node_id, contributor_id, code))
        while self.recent and (len(self.recent) > RECENT_MAX or self.recent[0][0] < now - RECENT_SECONDS):
            self.recent.popleft()
        sockets: set[Closable] = set()
        if isinstance(node_id, int):
            sockets |= self.by_node.get(node_id, set())
        if isinstance(contributor_id, int):
            sockets |= self.by_contributor.get(contributor_id, set())
        for socket in sockets:
            socket.close_for(code)

    def _node_paused(self, event: dict[str, Any]) -> None:
        node_id, paused = event.get("node_id"), event.get("paused")
        if not isinstance(node_id, int) or not isinstance(paused, bool):
            return
        now = self.clock()
        self.pause_news.pop(node_id, None)
        self.pause_news[node_id] = (now, paused)
        while self.pause_news and (
            len(self.pause_news) > RECENT_MAX or next(iter(self.pause_news.values()))[0] < now - RECENT_SECONDS
        ):
            self.pause_news.popitem(last=False)
        for socket in list(self.by_node.get(node_id, ())):
            socket.node_paused(paused)

    def register(self, socket: Closable, *, node_id: int, contributor_id: int, since: float) -> int | None:
        """Count `socket` as open for closes of its node and contributor. Returns the code of a close
        of either that arrived at or after `since` (the clock() read before the socket's authenticating
        call started): the call may have read the tables before that close committed. A pause or resume
        of its node that arrived since is told to it the same way."""
        for arrived, closed_node, closed_contributor, code in reversed(self.recent):
            if arrived < since:
                break
            if closed_node == node_id or closed_contributor == contributor_id:
                return code
        news = self.pause_news.get(node_id)
        if news is not None and news[0] >= since:
            socket.node_paused(news[1])
        self.where[socket] = (node_id, contributor_id)
        self.by_node.setdefault(node_id, set()).add(socket)
        self.by_contributor.setdefault(contributor_id, set()).add(socket)
        return None

    def _swarm_changed(self, event: dict[str, Any]) -> None:
        swarm_id = event.get("swarm_id")
        if not isinstance(swarm_id, int):
            places_forget()
            return
        place_forget(swarm_id)
        self.swarm_news[swarm_id] = (self.clock(), event)
        for socket in list(self.by_swarm.get(swarm_id, ())):
            socket.swarm_changed(event)

    def swarm_join(self, socket: Closable, swarm_id: int, *, since: float) -> None:
        """Count `socket` among its swarm's (a hello naming another swarm moves it). A change of that swarm
        that arrived at or after `since` (the clock() read before the socket read its swarm) is told to it."""
        self._swarm_leave(socket)
        self.swarm_of[socket] = swarm_id
        self.by_swarm.setdefault(swarm_id, set()).add(socket)
        news = self.swarm_news.get(swarm_id)
        if news is not None and news[0] >= since:
            socket.swarm_changed(news[1])

    def _swarm_leave(self, socket: Closable) -> None:
        swarm_id = self.swarm_of.pop(socket, None)
        members = self.by_swarm.get(swarm_id) if swarm_id is not None else None
        if members is not None:
            members.discard(socket)
            if not members:
                del self.by_swarm[swarm_id]

    def unregister(self, socket: Closable) -> None:
        self._swarm_leave(socket)
        place = self.where.pop(socket, None)
        if place is None:
            return
        for index, key in ((self.by_node, place[0]), (self.by_contributor, place[1])):
            members = index.get(key)
            if members is not None:
                members.discard(socket)
                if not members:
                    del index[key]

    def open_count(self) -> int:
        return len(self.where)


_by_loop = per_loop(SocketCloses)


def socket_closes() -> SocketCloses:
    """The running event loop's SocketCloses (a server process has one loop; tests make one per test)."""
    return _by_loop()
