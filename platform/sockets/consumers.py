"""The node WebSocket, `/ws/node/` (docs/protocol.md). A dispatcher: authenticate, parse a frame with
sockets.messages, make one call per request type, send the reply (its message type and codes are
sapo_node.protocol's names). A share is one call into its pipeline, pool.ingest (which waits for the
share's turn and runs the batch on a database thread); a sample or a report is one call to
pool.sampling or pool.services through common.db.db_call. A hello places the socket in its swarm
(sockets.swarm_places), hands what the node says about itself to the presence beat and, at the socket's
first welcome, reads the uploads the node owes (pool.audit_seam).

Database calls run on db_call's threads, in parallel across sockets, each thread keeping its
connection (not on Channels' one shared thread): opening a socket is one call (authenticate and open
the session in one statement that does not wait for the disk, nodes.sessions, and read the quota),
shared by the sockets opening at the same moment (sockets.opening);
what a node says in `hello` is written with the process's presence beat when it changed, and a
frame's bookkeeping (rate limit, presence, last seen) costs no database round trip (sockets.ratelimit,
nodes.presence).
What a socket costs the server is measured in docs/benchmarks.md, "Sockets".

Every frame gets exactly one reply, and nothing a node sends can raise out of `receive`: a refusal is
a typed `error` (with the frame's `ref` when it had a readable one), and an unexpected failure is
logged and answered `internal_error`. An exception escaping a consumer makes daphne close with 1011
and skip `disconnect()`, so none escapes: a failure while the socket opens (database or Redis down)
cleans the socket's state up and closes with protocol.CLOSE_TRY_AGAIN (an application cannot send
1011 itself: autobahn refuses every code but 1000 and 3000-4999).

Presence (nodes.presence): each accepted socket is one record, renewed by the process's heartbeat
(presence.SocketBook) while the socket is open and removed in `disconnect()`; a record whose server
died expires on its own. The record carries the socket's swarm once its hello (or its first frame,
the site's default) placed it.

Closes (a token revoked, a node retired, a ban), a node's pause from the site and swarms' changes are
socket orders (nodes.events): the socket registers with its process's sockets.closes.SocketCloses once
authenticated, which closes it (protocol.CLOSE_UNAUTHENTICATED or CLOSE_BANNED), sends it a `pause` or
tells it its swarm's new state; it joins no
channel-layer group of its own, and has no channel: the consumer reads only its own socket
(`__call__`), with no task per frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
import uuid
from typing import Any, get_args

import django.db
import psycopg
from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from common import metrics, outage
from common.compact_json import Raw, dumps, dumps_object
from common.db import db_call
from common.errors import ApplicationError
from nodes import presence
from nodes.services import node_hello_changed, node_hello_fields, node_status_fields
from pool import audit_seam
from pool.challenges import SocketChallenge
from pool.ingest import ShareIn, rollout_share_in_turn
from pool.ingest_statement import SwarmOfBatch
from pool.limits import Limits, current_limits
from pool.records import Report
from pool.sampling import rollout_sample
from pool.services import node_round_report
from sapo_node import __version__ as LATEST_CLIENT
from sapo_node import protocol
from sapo_node.tasks import Catalogue
from sockets import ratelimit
from sockets.closes import socket_closes
from sockets.epoch import current_pool_epoch
from sockets.heldout import CHECK_RNG, SocketHeldout, heldout_check_make, heldout_score_record
from sockets.messages import (
    HeldoutAnswers,
    Hello,
    Message,
    ProtocolError,
    Sample,
    Share,
    Status,
    frame_size,
    leading_ref,
    parse_frame,
)
from sockets.opening import session_opens
from sockets.swarm_places import place_after_change, place_limits, place_of_hello, swarm_state_message
from swarms.selectors import SwarmPlace

logger = logging.getLogger(__name__)

#: What a database or Redis that is down (or restarting) raises.
_DEPENDENCY_DOWN = (django.db.Error, psycopg.Error, RedisError, OSError)


def _bearer_token(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


_closing_tasks: set[asyncio.Task] = set()  # closes under way (a task nobody holds may be collected)

#: A hello's refusals and the close that follows each.
_HELLO_CLOSES = {
    protocol.UNKNOWN_SWARM: protocol.CLOSE_UNKNOWN_SWARM,
    protocol.SWARM_RETIRED: protocol.CLOSE_SWARM_RETIRED,
}
_STATES = (protocol.STATE_OPEN, protocol.STATE_PAUSED, protocol.STATE_RETIRED)

_announced: dict[tuple[int, Limits], tuple[Any, Raw, dict[str, int]]] = {}


def _catalogue_and_limits(catalogue: Catalogue, limits: Limits) -> tuple[Raw, dict[str, int]]:
    """What every `welcome` announces, made once per process, catalogue and limits: the catalogue as
    JSON and the limits as a dict (making them for every welcome was ~10% of the CPU a socket costs to
    open: docs/benchmarks.md, "Sockets")."""
    key = (id(catalogue), limits)
    cached = _announced.get(key)
    if cached is None or cached[0] is not catalogue:
        if len(_announced) >= 8:
            _announced.clear()
        cached = _announced[key] = (catalogue, Raw(dumps(catalogue.to_json())), limits.to_json())
    return cached[1], cached[2]


class NodeConsumer(AsyncWebsocketConsumer):
    node = None
    closing = False  # set once the server has decided to close: nothing more is sent
    #: The node's swarm, from its hello (before any hello: the site's default, taken at the first frame
    #: that needs it). Its state follows the swarm's through sockets.closes.
    place: SwarmPlace | None = None
    frame_ref: str | None = None  # the ref of the frame being answered, once read
    welcomed: dict[str, Any] | None = None  # the last welcome sent: told again with a new catalogue
    recatalogue: asyncio.Task | None = None  # reading the place of the swarm's newer catalogue version

    async def __call__(self, scope, receive, send) -> None:
        # Channels' AsyncConsumer.__call__ makes each consumer a channel on the layer and waits on it
        # and on the socket with two tasks, a new one per frame (await_many_dispatch). Closes reach
        # this consumer through sockets.closes instead, so it reads its socket only.
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        try:
            while True:
                await self.dispatch(await receive())
        except StopConsumer:
            pass
        finally:
            # However the consumer ends (daphne cancels one that outlives its socket without calling
            # disconnect()), the heartbeat stops renewing it and closes no longer look for it.
            socket_closes().unregister(self)
            if self.node is not None:
                presence.socket_book().closed(self.connection_id)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first runs close_old_connections on its one shared sync thread, for
        # every frame and event: a queue all sockets wait in. This consumer touches the database only
        # through db_call, which does that clean-up itself after each call, on its own threads.
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Channels' version ends with close_old_connections on the shared sync thread too (see dispatch).
        await self.disconnect(message["code"])
        raise StopConsumer()

    async def connect(self) -> None:
        # Accept first: a close code only reaches the client on an open WebSocket (a refused
        # handshake is a bare HTTP 403 without one).
        await self.accept()
        try:
            await self._open()
        except Exception as exc:  # keep no half-open state, and tell the node to come back later
            if isinstance(exc, _DEPENDENCY_DOWN):  # the incident, not a bug: one line per outage, no trace
                outage.dependency_failed(exc)
            else:
                logger.exception("opening a node socket failed; closed with %s", protocol.CLOSE_TRY_AGAIN)
            await self.disconnect(protocol.CLOSE_TRY_AGAIN)
            await self.close(code=protocol.CLOSE_TRY_AGAIN)

    async def _open(self) -> None:
        token = _bearer_token(self.scope)
        closes = socket_closes()
        try:
            await closes.listen()  # this process's one membership for closes (the first socket waits for it)
            since = closes.clock()
            self.limits = self.site_limits = current_limits()
            self.consecutive_errors = 0
            self.connection_id = uuid.uuid4()
            node, self.rate_limit = await session_opens().open(
                token=token, connection_id=self.connection_id, base_quota=self.limits.max_messages_per_minute
            )
            self.budget = ratelimit.Budget(
                messages=self.rate_limit,
                bytes=self.limits.max_bytes_per_minute,
                cpu_ms=self.limits.max_cpu_ms_per_minute,
            )
            self.owed_cpu_ms = 0  # what the last frame cost, charged with the next one (sockets.ratelimit)
            self.stored = None  # the bytes the last share left stored this hour (its budgets' next check)
            self.challenge = SocketChallenge(node.id)  # welcome.challenge, ack.challenge
            self.audits_told = False  # whether a welcome has named the uploads the node owes
            self.heldout = SocketHeldout()  # the held-out checks asked on this socket (sockets.heldout)
        except ApplicationError as exc:
            await self.close(code=protocol.CLOSE_BANNED if exc.code == "banned" else protocol.CLOSE_UNAUTHENTICATED)
            return
        self.node = node
        metrics.socket_opened()  # paired with socket_closed() in disconnect(), which runs once self.node is set
        presence.socket_book().opened(node_id=node.id, connection_id=self.connection_id)
        # No await between the call's answer and this: a close that arrived meanwhile is in `recent`.
        code = closes.register(self, node_id=node.id, contributor_id=node.owner_id, since=since)
        if code is not None:
            await self._shut(code)

    async def disconnect(self, code: int) -> None:
        # Runs once per socket however it ends (and again, harmlessly, after _shut). Each step is
        # guarded: a failing rate-limit store must not keep the presence record alive.
        socket_closes().unregister(self)
        if self.node is not None:
            node, self.node = self.node, None
            metrics.socket_closed()
            presence.socket_book().closed(self.connection_id)
            owed, self.owed_cpu_ms = self.owed_cpu_ms, 0
            try:
                await ratelimit.charge(node.id, self.budget, owed)
            except Exception:
                logger.exception("node %s: charging its last frame failed", node.id)
            try:
                await db_call(presence.connection_close, retry_lost=True)(
                    node_id=node.id,
                    connection_id=self.connection_id,
                    swarm_id=None if self.place is None else self.place.swarm_id,
                )
            except Exception as exc:  # the record expires by itself (presence.expires_after_seconds())
                if not outage.dependency_failed(exc):
                    logger.exception("node %s: forgetting connection %s failed", node.id, self.connection_id)

    # Closes (sockets.closes) ---------------------------------------------------------------------

    def close_for(self, code: int) -> None:
        """Close with `code` (a revocation, a retirement, a ban), now: a frame being answered gets no
        answer (its work, already under way, finishes)."""
        if not self.closing:
            self.closing = True
            task = asyncio.get_running_loop().create_task(self._shut(code))
            _closing_tasks.add(task)
            task.add_done_callback(_closing_tasks.discard)

    async def _shut(self, code: int) -> None:
        # Leave the registry and record the disconnection first: once the node sees the close, the
        # server is done with it.
        self.closing = True
        await self.disconnect(code)
        await self.close(code=code)

    # Frames ---------------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.node is None:
            return
        self.frame_ref = None
        try:
            await self._answer(text_data if text_data is not None else bytes_data)
        except Exception as exc:
            # A bug, or a dependency down (database, Redis): the node gets an answer (with the frame's
            # ref, so it sends the frame again), the log the trace or, for an outage, one line.
            if not outage.dependency_failed(exc):
                logger.exception("node %s: a frame failed", getattr(self.node, "id", None))
            with contextlib.suppress(Exception):
                await self._error(protocol.INTERNAL_ERROR, "the server failed to handle this frame", self.frame_ref)

    async def _answer(self, frame: str | bytes | None) -> None:
        node, budget = self.node, self.budget
        owed, self.owed_cpu_ms = self.owed_cpu_ms, 0
        self.frame_ref = leading_ref(frame)  # until the frame is parsed: any refusal carries it
        if not await ratelimit.admit(node.id, budget, size=frame_size(frame or ""), cpu_ms=owed):
            # Refused unparsed: a node over its rate costs the server no parsing, whatever it sends. The
            # ref, read from the frame's first characters, tells the node which request to send again.
            limits = f"{budget.messages} messages, {budget.bytes} bytes or {budget.cpu_ms} ms of server CPU"
            await self._error(protocol.RATE_LIMITED, f"more than {limits} per minute", leading_ref(frame))
            return
        # What this frame costs the server (parsing here, the share's work in its thread), charged to
        # the node's CPU budget with its next frame whatever the outcome.
        self.frame_cpu = 0.0
        try:
            await self._handle(frame)
        finally:
            self.owed_cpu_ms = math.ceil(self.frame_cpu * 1000)

    async def _handle(self, frame: str | bytes | None) -> None:
        node = self.node
        started = time.thread_time()  # read before any await: other sockets' work runs on this thread then
        try:
            message = parse_frame(frame, self.limits)
        except ProtocolError as exc:
            self.frame_cpu += time.thread_time() - started
            await self._error(exc.code, exc.detail, exc.ref)
            return
        self.frame_cpu += time.thread_time() - started
        self.frame_ref = message.ref
        try:
            reply = await self._dispatch(message)
        except ApplicationError as exc:
            await self._error(exc.code, exc.message, message.ref)
            return
        except Exception as exc:
            if not outage.dependency_failed(exc):
                logger.exception("node %s: %s failed", node.id, type(message).__name__)
            await self._error(protocol.INTERNAL_ERROR, "the server failed to handle this message", message.ref)
            return
        self.consecutive_errors = 0
        outage.DATABASE.answered()
        if reply is not None:
            await self._send(reply, message.ref)
        if isinstance(message, Report):
            await self._ask_heldout(message.round)
        presence.socket_book().seen(node.id)  # written with the others' on the next beat

    async def _dispatch(self, message: Message) -> dict[str, Any] | None:
        """The reply to one parsed frame, or None when there is none to send (the frame was answered
        and the socket closed, or refused for a paused swarm): one handler per message type."""
        return await _HANDLERS[type(message)](self, message)

    async def _open_place(self, ref: str | None) -> SwarmPlace | None:
        """The socket's swarm for a share, a sample or a report; None once the node was told its swarm
        is paused (the frame is answered by that)."""
        place = await self._in_swarm()
        if place.state == protocol.STATE_PAUSED:
            await self._paused(ref)
            return None
        return place

    async def _status(self, message: Status) -> dict[str, Any]:
        # Written with the process's next beat (presence.SocketBook).
        fields = node_status_fields(
            state=message.state,
            paused_for=message.paused_for,
            round_seconds=message.round_seconds,
            tokens_per_second=message.tokens_per_second,
            preparing=message.preparing,
            progress=message.progress,
            eta_seconds=message.eta_seconds,
        )
        presence.socket_book().reported(self.node.id, fields)
        return {"type": protocol.ACK, "for": protocol.STATUS}

    async def _share(self, message: Share) -> dict[str, Any] | None:
        if (place := await self._open_place(message.ref)) is None:
            return None
        # The share waits for its turn, behind the nodes that cost the least lately, and goes with
        # other nodes' shares of the same swarm waiting at once (pool.ingest, step 0).
        result, cpu = await rollout_share_in_turn(
            share=ShareIn(node=self.node, rollouts=message.rollouts, stored=self.stored),
            limits=self.limits,
            catalogue=place.catalogue,
            swarm=SwarmOfBatch(place.swarm_id, place.catalogue_version),
            frame_cpu=self.frame_cpu,
        )
        self.stored = result.stored
        self.frame_cpu += cpu
        return {
            "type": protocol.ACK,
            "for": protocol.SHARE,
            "accepted": result.accepted,
            "rejected": result.rejected,
            "challenge": self.challenge.current(),
            **({"audits": result.audits} if result.audits else {}),  # what to upload (docs/audits.md)
        }

    async def _sample(self, message: Sample) -> dict[str, Any] | None:
        if (place := await self._open_place(message.ref)) is None:
            return None
        rollouts = await db_call(rollout_sample, retry_lost=True)(
            node=self.node, n=message.n, window_seconds=self.limits.sample_window_seconds, swarm_id=place.swarm_id
        )
        return {"type": protocol.SAMPLES, "rollouts": rollouts}

    async def _report(self, message: Report) -> dict[str, Any] | None:
        if (place := await self._open_place(message.ref)) is None:
            return None
        await db_call(node_round_report)(node=self.node, report=message, limits=self.limits, swarm_id=place.swarm_id)
        return {"type": protocol.ACK, "for": protocol.REPORT, "round": message.round}

    async def _heldout_answers(self, message: HeldoutAnswers) -> dict[str, Any]:
        place = await self._in_swarm()
        check, texts = self.heldout.take(message, time.time())  # a refusal raises: nothing stored
        score = await db_call(heldout_score_record)(
            node_id=self.node.id, swarm_id=place.swarm_id, check=check, texts=texts, round_=message.round
        )
        check.answered = True
        return {
            "type": protocol.ACK,
            "for": protocol.HELDOUT_ANSWERS,
            "check": str(check.id),
            "score": score.score,
            "questions": score.questions,
        }

    async def _hello(self, message: Hello) -> dict[str, Any] | None:
        """Place the socket in the swarm the hello names, note what the node says of itself, welcome it
        (None: the hello was refused and the socket closed)."""
        since = socket_closes().clock()
        try:
            place, cost = await db_call(place_of_hello, retry_lost=True)(slug=message.swarm)
            self.frame_cpu += cost
        except ApplicationError as exc:
            if exc.code not in _HELLO_CLOSES:
                raise
            # Retrying cannot help: the node is told why in the error, then closed with the code that
            # says so (its client stops and keeps its run directory).
            await self._error(exc.code, exc.message, message.ref)
            await self._shut(_HELLO_CLOSES[exc.code])
            return None
        self._join(place, since=since)
        self.heldout.supported = message.heldout
        self._note_said(message)
        self.welcomed = await self._welcome(place)
        return self.welcomed

    def _note_said(self, hello: Hello) -> None:
        # What the node says about itself is written with the process's next beat (presence.SocketBook,
        # one statement for every node that said something new), not by a call per hello; a node
        # reconnecting says the same again, and nothing is written. (Its last seen was written when
        # the socket opened.)
        node = self.node
        said = node_hello_fields(client=hello.client, model=hello.model, hardware=hello.hardware)
        if node_hello_changed(node=node, fields=said):
            for name, value in said.items():
                setattr(node, name, value)
            presence.socket_book().said(node.id, said)

    async def _welcome(self, place: SwarmPlace) -> dict[str, Any]:
        node = self.node
        catalogue, limits = _catalogue_and_limits(place.catalogue, self.limits)
        # The uploads still owed, at the socket's first welcome only: later ones reach the node in its
        # shares' acks, and a node saying hello again on the socket costs no statement.
        asked: list[dict[str, Any]] = []
        if not self.audits_told:
            asked = await db_call(audit_seam.audits().node_audits, retry_lost=True)(node_id=node.id)
            self.audits_told = True
        # The limits announced are what the server will hold this node to: max_messages_per_minute is its
        # trust's share of the configured quota (moderation.trust), so the client paces itself to it
        # (a node told the configured 600 while held to 195 was refused by the hundred).
        limits = {**limits, "max_messages_per_minute": int(self.budget.messages)}
        return {
            "type": protocol.WELCOME,
            "node_id": node.id,
            "node_name": node.name,
            "challenge": self.challenge.current(),
            "audits": asked,
            # Whether the owner paused the node from the site (a `pause` frame tells it of a change), and
            # the client version this site serves (node_client's, which web.wheel builds).
            "paused": node.paused_at is not None,
            "latest_client": LATEST_CLIENT,
            "catalogue": catalogue,
            "limits": limits,
            "swarm": {
                "slug": place.slug,
                "state": place.state,
                "catalogue_version": place.catalogue_version,
                "recommended_models": list(place.recommended_models),
                "local": place.default_local,
                "external": place.default_external,
            },
            # The pool's epoch changes on a restore; the node makes its group ids by the server's clock.
            "pool_epoch": await current_pool_epoch(),
            "server_time": round(time.time(), 3),
        }

    async def _ask_heldout(self, round_: int) -> None:
        """Ask the node a held-out check when its report of `round_` earns one (sockets.heldout). Never
        fails the socket: a check not asked is only a figure missing."""
        now = time.time()
        place = self.place
        if place is None or place.state != protocol.STATE_OPEN or not self.heldout.due(round_, now):
            return
        try:
            check = await asyncio.to_thread(
                heldout_check_make,
                catalogue=place.catalogue,
                questions=settings.SAPO_HELDOUT_QUESTIONS,
                now=now,
                rng=CHECK_RNG,
            )
        except Exception:
            logger.exception("node %s: making a held-out check failed", self.node.id)
            return
        if check is None:
            return
        self.heldout.record(check, round_, now)
        await self._send(check.wire(settings.SAPO_HELDOUT_MAX_NEW_TOKENS), None)

    # Swarms (sockets.swarm_places) -------------------------------------------------------------

    async def _in_swarm(self) -> SwarmPlace:
        """The socket's swarm: the site's default until a hello names one; once a change of it names a
        newer catalogue version, that version's (read before the frame is handled)."""
        if self.recatalogue is not None:
            await asyncio.shield(self.recatalogue)
        if self.place is None:
            since = socket_closes().clock()
            place, cost = await db_call(place_of_hello, retry_lost=True)(slug=None)
            self.frame_cpu += cost
            self._join(place, since=since)
        assert self.place is not None
        return self.place

    def _join(self, place: SwarmPlace, *, since: float) -> None:
        """Count the socket in `place`'s swarm, read from the tables after `since` (SocketCloses.clock())."""
        self.place = place
        self.limits = place_limits(self.site_limits, place)
        socket_closes().swarm_join(self, place.swarm_id, since=since)
        presence.socket_book().joined(self.connection_id, place.swarm_id)  # written with the next beat

    async def _paused(self, ref: str | None) -> None:
        # Not an error of the node's: it does not count towards max_consecutive_errors.
        assert self.place is not None
        detail = f"swarm {self.place.slug!r} is paused: train in silo, share again when it opens"
        await self._send({"type": protocol.ERROR, "code": protocol.SWARM_PAUSED, "detail": detail}, ref)

    def swarm_changed(self, event: dict[str, Any]) -> None:
        """The socket's swarm changed (sockets.closes, on the event loop): a newer catalogue version is read
        and told (`_catalogue_changed`); a change of state is told; a retired swarm's sockets are closed
        with protocol.CLOSE_SWARM_RETIRED."""
        version = event.get("catalogue_version")
        if self.place is not None and isinstance(version, int) and version > self.place.catalogue_version:
            if self.recatalogue is None and not self.closing:
                self.recatalogue = asyncio.get_running_loop().create_task(self._catalogue_changed(version))
        place, state = self.place, event.get("state")
        if place is None or self.closing or state == place.state or state not in _STATES:
            return
        self.place = dataclasses.replace(place, state=state)
        message = swarm_state_message(slug=place.slug, state=state, open_swarms=list(event.get("open") or []))
        task = asyncio.get_running_loop().create_task(self._tell_swarm_state(message))
        _closing_tasks.add(task)
        task.add_done_callback(_closing_tasks.discard)

    async def _catalogue_changed(self, version: int) -> None:
        """Take the swarm's catalogue `version` (or newer): the next share is verified against it, and
        the node gets a welcome again with it (the frame whose catalogue a client follows)."""
        try:
            assert self.place is not None
            place = await place_after_change(self.place.swarm_id, version)
            if place.swarm_id == self.place.swarm_id and place.catalogue_version > self.place.catalogue_version:
                self.place = dataclasses.replace(place, state=self.place.state)  # its state is swarm_state's
                if self.welcomed is not None:
                    catalogue, _ = _catalogue_and_limits(place.catalogue, self.limits)
                    # What changed since that welcome is said as it is now: the swarm's state, the pause.
                    swarm = {
                        **self.welcomed["swarm"],
                        "catalogue_version": place.catalogue_version,
                        "state": self.place.state,
                    }
                    welcome = {**self.welcomed, "catalogue": catalogue, "swarm": swarm, "audits": []}
                    if "paused" in welcome and self.node is not None:
                        welcome["paused"] = self.node.paused_at is not None
                    welcome.pop("ref", None)
                    welcome.update(challenge=self.challenge.current(), server_time=round(time.time(), 3))
                    await self._send(welcome, None)
        except Exception as exc:  # the database down: the socket keeps its version until its next change
            if not outage.dependency_failed(exc):
                logger.exception("node socket: reading catalogue version %s of its swarm failed", version)
        finally:
            self.recatalogue = None

    async def _tell_swarm_state(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the socket may be closing meanwhile
            await self._send(message, None)
        if message["state"] == protocol.STATE_RETIRED:
            self.close_for(protocol.CLOSE_SWARM_RETIRED)

    def node_paused(self, paused: bool) -> None:
        """The owner paused the node from the site, or resumed it (sockets.closes, on the event loop): tell it.
        A client older than the `pause` message ignores it; the site shows that it did not say so."""
        node = self.node
        if node is None or self.closing or (node.paused_at is not None) == paused:
            return
        node.paused_at = timezone.now() if paused else None  # a hello again on this socket says the same
        detail = "paused from the site: finish the step, then wait" if paused else "resumed from the site"
        message = {"type": protocol.PAUSE, "paused": paused, "detail": detail}
        task = asyncio.get_running_loop().create_task(self._tell(message))
        _closing_tasks.add(task)
        task.add_done_callback(_closing_tasks.discard)

    async def _tell(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the socket may be closing meanwhile
            await self._send(message, None)

    async def _send(self, payload: dict[str, Any], ref: str | None) -> None:
        if self.closing:
            return
        payload["v"] = protocol.VERSION
        if ref is not None:
            payload["ref"] = ref
        await self.send(text_data=dumps_object(payload))

    async def _error(self, code: str, detail: str, ref: str | None) -> None:
        if code != protocol.INTERNAL_ERROR:  # the server's own failures never count against the node
            self.consecutive_errors += 1
        await self._send({"type": protocol.ERROR, "code": code, "detail": detail}, ref)
        if self.consecutive_errors >= self.limits.max_consecutive_errors:
            await self._shut(protocol.CLOSE_TOO_MANY_ERRORS)


#: One handler per node message type (sockets.messages.Message): a new type is named here.
_HANDLERS = {
    Hello: NodeConsumer._hello,
    Share: NodeConsumer._share,
    Sample: NodeConsumer._sample,
    Report: NodeConsumer._report,
    Status: NodeConsumer._status,
    HeldoutAnswers: NodeConsumer._heldout_answers,
}
assert set(_HANDLERS) == set(get_args(Message)), "every node message type has a handler"
