"""Closing node sockets from anywhere: one channel-layer membership per server process, not per socket.

nodes.events sends a close (a token revoked, a node retired, a ban) as one message to CLOSES_GROUP.
Each process (each event loop) has one `SocketCloses`: it joins that group once, before its first
node socket counts as open, joins it again every REJOIN_SECONDS, and keeps its open sockets by node
and by contributor; a close that arrives closes the matching sockets of this process. The membership
lives only in Redis, which can lose it (a restart without persistence, a failover to an empty replica,
eviction; the layer itself forgets it a day after it was added): re-joined every few seconds, a worker
misses closes for at most that long after Redis forgot it. A close sent while Redis is down is kept
and sent when it answers again (nodes.events).

A socket opening is authenticated by one database call (pool.opening: shared with the sockets opening
with it, nodes.sessions.nodes_sessions_open) and then registered here, on the event loop, with no
await in between. A close that committed after that call read the tables reaches this process either
before the socket registers or after:
- after: the socket is registered, and the close closes it;
- before: the close is remembered (`recent`, for RECENT_SECONDS), and `register` answers its code for
  a socket whose call started before the close arrived.
A close that arrived before the call started was committed before the call read the tables, which then
refused the token or saw the ban. So no close is missed however the two interleave. (A socket whose
call started before a close of its *other*, revoked token arrived is closed too, with 4401: it
reconnects, and is authenticated again.)
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Protocol

from channels.layers import get_channel_layer

from common import outage
from common.loops import per_loop
from nodes.events import CLOSES_GROUP, CLOSES_REJOIN_SECONDS
from pool.swarm_places import SWARM_CHANGED, place_forget
from sapo_node import protocol

logger = logging.getLogger(__name__)

#: How long a close is remembered for sockets whose authentication was in flight when it arrived:
#: longer than any database call takes.
RECENT_SECONDS = 600.0
#: At most this many closes are remembered (a burst of bans cannot grow it without bound).
RECENT_MAX = 100_000
#: Seconds between two joins of CLOSES_GROUP (one ZADD to Redis: the longest a close can go unheard
#: after Redis lost the membership).
REJOIN_SECONDS = CLOSES_REJOIN_SECONDS


class Closable(Protocol):
    def close_for(self, code: int) -> None: ...

    def swarm_changed(self, event: dict[str, Any]) -> None: ...


class SocketCloses:
    """One event loop's open node sockets, and its membership of CLOSES_GROUP."""

    def __init__(self) -> None:
        self.by_node: dict[int, set[Closable]] = {}
        self.by_contributor: dict[int, set[Closable]] = {}
        self.where: dict[Closable, tuple[int, int]] = {}
        self.by_swarm: dict[int, set[Closable]] = {}
        self.swarm_of: dict[Closable, int] = {}
        # (arrived at, node id, contributor id, code), oldest first
        self.recent: collections.deque[tuple[float, int | None, int | None, int]] = collections.deque()
        self.joined: asyncio.Future | None = None
        self.tasks: set[asyncio.Task] = set()

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    async def listen(self) -> None:
        """Join CLOSES_GROUP if this process has not yet (the first socket waits for it; a failure, the
        channel layer down, is raised, and the next socket tries again)."""
        if self.joined is not None and self.joined.done() and self.joined.exception() is None:
            return
        if self.joined is None or (self.joined.done() and self.joined.exception() is not None):
            layer = get_channel_layer()
            if layer is None:  # no channel layer: nothing can send a close either
                self.joined = asyncio.get_running_loop().create_future()
                self.joined.set_result(None)
                return
            self.joined = asyncio.get_running_loop().create_future()
            self._spawn(self._listen(layer, self.joined))
        await asyncio.shield(self.joined)

    async def _listen(self, layer: Any, joined: asyncio.Future) -> None:
        try:
            channel = await layer.new_channel()
            await layer.group_add(CLOSES_GROUP, channel)
        except Exception as exc:
            joined.set_exception(exc)
            joined.exception()  # retrieved: the sockets waiting on it raise it themselves
            return
        joined.set_result(None)
        self._spawn(self._keep_joined(layer, channel))
        while True:
            try:
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the layer is down: try again in a moment
                if not outage.dependency_failed(exc):
                    logger.exception("receiving socket closes failed")
                await asyncio.sleep(1.0)
                continue
            try:
                self.deliver(event)
            except Exception:
                logger.exception("a socket close could not be delivered: %r", event)

    async def _keep_joined(self, layer: Any, channel: str) -> None:
        # Within half the layer's group expiry too (a layer forgets a membership that long after it was added).
        every = min(REJOIN_SECONDS, max(1.0, getattr(layer, "group_expiry", 86_400) / 2))
        while True:
            await asyncio.sleep(every)
            try:
                await layer.group_add(CLOSES_GROUP, channel)
            except Exception as exc:  # the layer is down: again at the next turn
                if not outage.dependency_failed(exc):
                    logger.exception("joining %s again failed", CLOSES_GROUP)
            else:
                outage.REDIS.answered()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def deliver(self, event: dict[str, Any]) -> None:
        """A close from nodes.events: close this process's matching sockets, and remember it. A swarm's
        change (pool.swarm_places): tell this process's sockets of that swarm."""
        if event.get("type") == SWARM_CHANGED:
            self._swarm_changed(event)
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

    def register(self, socket: Closable, *, node_id: int, contributor_id: int, since: float) -> int | None:
        """Count `socket` as open for closes of its node and contributor. Returns the code of a close
        of either that arrived at or after `since` (the clock() read before the socket's authenticating
        call started): the call may have read the tables before that close committed."""
        for arrived, closed_node, closed_contributor, code in reversed(self.recent):
            if arrived < since:
                break
            if closed_node == node_id or closed_contributor == contributor_id:
                return code
        self.where[socket] = (node_id, contributor_id)
        self.by_node.setdefault(node_id, set()).add(socket)
        self.by_contributor.setdefault(contributor_id, set()).add(socket)
        return None

    def _swarm_changed(self, event: dict[str, Any]) -> None:
        swarm_id = event.get("swarm_id")
        place_forget(swarm_id if isinstance(swarm_id, int) else None)
        for socket in list(self.by_swarm.get(swarm_id, ())) if isinstance(swarm_id, int) else ():
            socket.swarm_changed(event)

    def swarm_join(self, socket: Closable, swarm_id: int) -> None:
        """Count `socket` among its swarm's (a hello naming another swarm moves it)."""
        self._swarm_leave(socket)
        self.swarm_of[socket] = swarm_id
        self.by_swarm.setdefault(swarm_id, set()).add(socket)

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
