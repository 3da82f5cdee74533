"""Sockets that open together share their database call: one statement opens all their sessions.

A node socket opens with one database call (nodes.sessions: the token checked, the node's standing,
last seen, presence; then its message quota from moderation). When a thousand nodes come back at
once (a server restart, a new swarm), a call per socket costs each of them a thread hand-off, a
statement's execution in psycopg and PostgreSQL's per-statement work: a third of what the server
spends opening a socket (docs/benchmarks.md, "Sockets").

`SessionOpens` (one per event loop) lets at most MAX_CALLS calls run at once; a socket opening while
they are busy waits for the next one, which takes every socket waiting by then (up to MAX_BATCH).
Alone, a socket's call starts at once. Each socket gets its own answer: its node and
quota, or its refusal (ApplicationError, raised in that socket's `open`); a call that fails (the
database is down) fails every socket it carried, as each one's own call would have.

While the database is down, each call waits the pool's timeout (SAPO_DB_POOL_TIMEOUT) for a
connection, and a call that waited for one of common.db's threads meanwhile would then wait it again:
its sockets would close twice as late. So a call that finds, once its thread takes it, that another
call found no connection after it was submitted fails at once, as that one did (4503 within the
pool's timeout; docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from django.db import OperationalError

from common.db import db_call, no_connection_to_be_had
from common.errors import ApplicationError
from common.loops import per_loop
from nodes.sessions import nodes_sessions_open
from pool.seams import moderation

#: Calls running at once (each holds one of common.db's threads while it runs).
MAX_CALLS = 4
#: Sockets opened by one call at most.
MAX_BATCH = 256


def _open_sessions(*, requests: list[tuple[str | None, uuid.UUID]], base_quota: int) -> list[Any]:
    """nodes_sessions_open, then the opened nodes' message quotas (moderation may lower a node's
    share of `base_quota` with its trust): (node, quota) or an ApplicationError per request."""
    answers = nodes_sessions_open(requests=requests)
    opened = [a.id for a in answers if not isinstance(a, ApplicationError)]
    quotas = moderation().node_message_quotas(node_ids=opened, base=base_quota) if opened else {}
    return [a if isinstance(a, ApplicationError) else (a, quotas[a.id]) for a in answers]


class SessionOpens:
    def __init__(self) -> None:
        self._waiting: list[tuple[str | None, uuid.UUID, int, asyncio.Future]] = []
        self._calls: set[asyncio.Task] = set()
        self.batches: list[int] = []  # sockets per call, the latest few (tests and benchmarks read it)
        self.unreachable_at = float("-inf")  # when a call last found no database connection (monotonic)

    async def open(self, *, token: str | None, connection_id: uuid.UUID, base_quota: int) -> tuple[Any, int]:
        """(node, message quota) for a socket that opened with `token`. Raises ApplicationError
        "unauthenticated" or "banned", or what the database call raised."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((token, connection_id, base_quota, future))
        if len(self._calls) < MAX_CALLS:
            task = asyncio.create_task(self._call())
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        return await future

    async def _call(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            batch = [b for b in batch if not b[3].done()]  # a socket that went away meanwhile
            for base in sorted({b[2] for b in batch}):  # one base quota per process, unless limits changed
                await self._open([b for b in batch if b[2] == base], base)

    async def _open(self, batch: list[tuple[str | None, uuid.UUID, int, asyncio.Future]], base: int) -> None:
        self.batches = [*self.batches[-99:], len(batch)]
        submitted = time.monotonic()

        def open_sessions(**kwargs: Any) -> list[Any]:
            # On the database thread: read when it takes the call, written before it takes the next.
            if self.unreachable_at > submitted:
                raise OperationalError("no database connection came within the pool's timeout (another call)")
            try:
                return _open_sessions(**kwargs)
            except Exception as exc:
                if no_connection_to_be_had(exc):
                    self.unreachable_at = time.monotonic()
                raise

        try:
            answers = await db_call(open_sessions, retry_lost=True)(
                requests=[(t, c) for t, c, _, _ in batch], base_quota=base
            )
            for (*_, future), answer in zip(batch, answers, strict=True):
                if future.done():
                    continue  # the socket went away while its call ran
                if isinstance(answer, ApplicationError):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        except Exception as exc:  # every socket still waiting fails as its own call would have
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
        except BaseException:  # this call was cancelled (the loop is stopping): so are its sockets' opens
            for *_, future in batch:
                future.cancel()
            raise


session_opens = per_loop(SessionOpens)
