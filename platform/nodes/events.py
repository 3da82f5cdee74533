"""Telling a node's open WebSockets to close, after the transaction that caused it commits.

Every server process joins one channel-layer group, CLOSES_GROUP, once (pool.closes), and keeps a
registry of its open node sockets by node and by contributor. A close is one message to that group
(`close_event`): every process closes its own sockets of that node (4401 when the node's tokens were
revoked or the node retired, 4403 on a ban) or of every node of that contributor (4403, a ban).
One group per process, not two per socket (node and contributor): a socket's own groups would cost
two group_add per socket opened, two group_discard per socket closed and a task per socket renewing
them, which a crowd of sockets opening at once pays for (docs/benchmarks.md, "Sockets").

A close that cannot be sent (Redis down) does not fail the action that caused it: that committed, and
the revocation or ban is in force (a new socket is refused by the database). The close is kept in this
process (`_unsent`, oldest first, at most UNSENT_MAX) and sent again every RESEND_SECONDS by a thread
until Redis answers, so the sockets already open close then; each is sent once more
CLOSES_REJOIN_SECONDS later, for the processes that had not yet joined the group again (a Redis that
comes back empty has forgotten every membership; a second close of a closed socket does nothing). A process that stops meanwhile loses its
unsent closes; the sockets they were for close when their server restarts or at their next reconnect.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from common import outage
from sapo_node.protocol import CLOSE_BANNED, CLOSE_UNAUTHENTICATED

__all__ = ["CLOSES_GROUP", "CLOSE_BANNED", "CLOSE_UNAUTHENTICATED", "close_event"]

logger = logging.getLogger(__name__)

#: The channel-layer group every server process joins once (pool.closes).
CLOSES_GROUP = "node-closes"
#: Seconds between two joins of CLOSES_GROUP by each process (pool.closes): after Redis lost its data,
#: the longest a process is out of the group.
CLOSES_REJOIN_SECONDS = 5.0
#: Seconds between two tries to send the closes Redis refused.
RESEND_SECONDS = 1.0
#: At most this many unsent closes are kept (the oldest are dropped past it).
UNSENT_MAX = 10_000
#: A close's type on the channel layer (a message between server processes, not a node protocol frame).
CLOSE_EVENT = "node.disconnect"

_unsent: collections.deque[dict] = collections.deque(maxlen=UNSENT_MAX)
_unsent_lock = threading.Lock()
_resender: threading.Thread | None = None


def close_event(*, code: int, reason: str, node_id: int | None = None, contributor_id: int | None = None) -> dict:
    """The message that closes the open sockets of one node, or of every node of one contributor."""
    if (node_id is None) == (contributor_id is None):
        raise ValueError("a close names a node or a contributor")
    return {
        "type": CLOSE_EVENT,
        "code": code,
        "reason": reason,
        "node_id": node_id,
        "contributor_id": contributor_id,
    }


def node_disconnect_on_commit(*, node_id: int, code: int, reason: str) -> None:
    """Close the node's open sockets with `code` once the current transaction commits."""
    _disconnect_on_commit(close_event(node_id=node_id, code=code, reason=reason))


def contributor_disconnect_on_commit(*, user_id: int, code: int, reason: str) -> None:
    """Close every open socket of every node of the contributor (one message, all server processes)."""
    _disconnect_on_commit(close_event(contributor_id=user_id, code=code, reason=reason))


def _send(event: dict) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(CLOSES_GROUP, event)


def _disconnect_on_commit(event: dict) -> None:
    def send() -> None:
        with _unsent_lock:
            waiting = bool(_unsent)
        if waiting:  # after the closes already waiting, in order
            _keep(event)
            return
        try:
            _send(event)
        except Exception as exc:
            if not outage.dependency_failed(exc):
                logger.exception("sending a socket close failed; it is sent again later")
            _keep(event)

    transaction.on_commit(send)


def _keep(event: dict) -> None:
    global _resender
    with _unsent_lock:
        _unsent.append(event)
        if _resender is None:
            _resender = threading.Thread(target=_resend, name="sapo-closes-resend", daemon=True)
            _resender.start()


def _resend() -> None:
    """Send the kept closes, oldest first, until none is left (the thread then ends)."""
    global _resender
    time.sleep(RESEND_SECONDS)
    sent: list[dict] = []
    while True:
        with _unsent_lock:
            if not _unsent:
                if not sent:
                    _resender = None  # under the lock: a close kept from now on starts a new thread
                    return
                event = None
            else:
                event = _unsent[0]
        if event is None:  # all sent: once more when every process has joined again
            time.sleep(CLOSES_REJOIN_SECONDS + 1.0)
            for again in sent:
                try:
                    _send(again)
                except Exception as exc:  # Redis down again: it is kept once more
                    if not outage.dependency_failed(exc):
                        logger.exception("sending a socket close failed; it is sent again later")
                    with _unsent_lock:
                        _unsent.append(again)
            sent = []
            continue
        try:
            _send(event)
        except Exception as exc:
            if not outage.dependency_failed(exc):
                logger.exception("sending a socket close failed; it is sent again later")
            time.sleep(RESEND_SECONDS)
            continue
        outage.REDIS.answered()
        sent.append(event)
        with _unsent_lock:
            if _unsent and _unsent[0] is event:
                _unsent.popleft()
