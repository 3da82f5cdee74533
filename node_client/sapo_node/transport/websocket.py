"""The platform transport: one WebSocket (docs/protocol.md) driven by a background thread.

The thread runs an asyncio loop with the `websockets` client. It says hello on every connect,
sends shares from the on-disk outbox (resending whatever was not acknowledged before a lost
connection), keeps a buffer of external groups topped up with `sample` requests, sends reports,
and reconnects with exponential backoff and jitter. Nothing it does raises into the training
loop: the loop only appends to the outbox and takes what is in the buffer. Close code 4401 (bad
token) or 4403 (banned) stops the retries with a clear message; the node goes on in silo. Close code
4503 (the server cannot open a session now) is retried with the backoff below, never reset by it.

Reconnecting as a crowd (a server restart drops every node at the same instant): each retry waits
`retry_pause(delay)`, the delay doubling from BACKOFF_MIN to BACKOFF_MAX and each pause drawn
between half and one and a half of it, the first one included, so the nodes arrive spread out
rather than together. A socket that opened waits WELCOME_TIMEOUT for its welcome: a server busy with
the crowd answers late, and a node that gave up and came back would only add to its queue.
bench/sockets.py measures the crowd's return with this same policy (docs/benchmarks.md, "Sockets").

Within the server's budgets: every frame goes out through a `FramePacer` set from `welcome.limits`,
so a node that trains fast (a small model on a fast machine makes a round in a fraction of a second)
sends fewer, larger share frames and one report for the rounds it made meanwhile, instead of being
refused with `rate_limited` (refusals count against the budget too, and `max_consecutive_errors` of
them close the socket with 4429).

A full disk (the outbox cannot be written): groups the loop shares and verdicts the server sends are
kept in memory (`_unwritten`, `_verdicts`) and written when the outbox can be written again; meanwhile
the node goes on sharing and sampling. The log says so once when it starts and once when it ends.

Swarms (sapo_node/outbox.py): each group is queued with the swarm it is made for (the last welcome's,
or before any welcome the swarm the hello names) and sent only on a socket welcomed into that swarm.
A welcome says in one line how many groups wait for other swarms. When the node's swarm is retired (a
`swarm_state` saying so, the error `swarm_retired` to its hello, or the close 4410), its groups are
dropped with one line, those the node makes afterwards too: none is shared into another swarm.

Audits (docs/protocol.md, "Proof of work"): the newest challenge of `welcome.challenge` and
`ack.challenge` is the one the next round's questions come from (`challenge`); the audits a welcome
or a share's ack names are handed to the CheckpointUploader (sapo_node.transport.upload) before the
ack's verdicts are recorded, so the file an audit asks for is held before its groups stop keeping it;
`unsettled_weights` names the weights of the groups still waiting for a verdict.

Pause and status (docs/protocol.md, "status" and "pause"): a welcome's `paused` and a `pause` frame hold
or release the node's pause gate (sapo_node.pause) for protocol.PAUSE_SITE; while the gate holds any
reason nothing is shared, sampled or reported (the outbox keeps what waits), and the loop waits at its
next step. A `status` frame tells the server the node's state, its last round's figures and the gate's
reasons whenever one changes, and every STATUS_EVERY_SECONDS meanwhile (so a node in a long round is
seen); only to a server whose welcome has `paused` (an older one would answer unknown_type). A
welcome's `latest_client` newer than this client's version is said once (UPGRADE_LINE).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import random
import shlex
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from sapo_node import __version__, proof, protocol
from sapo_node.groups import Group
from sapo_node.ids import clock_set
from sapo_node.outbox import ACCEPTED, ACK_RETENTION_SECONDS, PENDING, REFUSED, REJECTED, Outbox
from sapo_node.pause import PauseGate
from sapo_node.tasks import Catalogue
from sapo_node.transport.base import Hello, Preparing, Transport, TransportCounts
from sapo_node.transport.upload import CheckpointUploader, http_base, parse_audits

if TYPE_CHECKING:
    from sapo_node.commitments import CommitmentStore

log = logging.getLogger("sapo_node.transport")

#: Seconds before the first retry after a lost connection; doubled after each failed one, up to BACKOFF_MAX.
BACKOFF_MIN = 1.0
BACKOFF_MAX = 60.0
#: Seconds for the TCP connection and the WebSocket handshake.
OPEN_TIMEOUT = 30.0
#: Seconds an open socket waits for `welcome` before giving up and retrying.
WELCOME_TIMEOUT = 60.0
#: Seconds between two `status` frames when nothing changed: well within the site's two minutes of
#: silence after which a node no longer counts as online (nodes.models.ONLINE_WINDOW).
STATUS_EVERY_SECONDS = 30.0
#: Said once when the server names a newer client (`welcome.latest_client`).
UPGRADE_LINE = (
    "sapo-node {latest} is out (this is {current}): upgrade with the install command on the site's /download/ page"
)


def version_key(version: str) -> tuple[int, ...] | None:
    """A version's numbers for comparing ("0.10.2" -> (0, 10, 2)); None when it is not dotted numbers."""
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 6 or not all(p.isdigit() and len(p) <= 6 for p in parts):
        return None
    return tuple(int(p) for p in parts)


def newer_client(latest: object, current: str = __version__) -> str | None:
    """`latest` when it is a newer version than `current`, else None (unparsable: None)."""
    if not isinstance(latest, str) or len(latest) > 40:
        return None
    ours, theirs = version_key(current), version_key(latest)
    return latest if ours is not None and theirs is not None and theirs > ours else None


def retry_pause(delay: float, rng: random.Random | None = None) -> float:
    """The pause before a retry: `delay` with jitter (uniform between 0.5 and 1.5 times it), so nodes
    dropped together do not come back together."""
    return delay * (rng or random).uniform(0.5, 1.5)


#: Share of the server's per-minute frame and byte allowances (welcome.limits) a node spends: the
#: server's buckets are shared by all of the node's connections, and a reconnect starts paced.
BUDGET_SHARE = 0.8
#: Seconds of that allowance a node may spend at once (a burst), then it goes at the refill rate.
BURST_SECONDS = 10.0


class FramePacer:
    """The node's side of the server's budgets (docs/protocol.md, "Budgets"): two token buckets, frames
    and their bytes, refilled at BUDGET_SHARE of `max_messages_per_minute` and `max_bytes_per_minute`
    and holding BURST_SECONDS of that. Unlimited until `configure` is given limits. A frame larger
    than the byte bucket waits until it is full (the server admits such a frame on a full bucket)."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._rates: tuple[float, float] | None = None  # frames/s, bytes/s
        self._caps = (0.0, 0.0)
        self._tokens = [0.0, 0.0]
        self._at = clock()

    def configure(self, limits: dict[str, int]) -> None:
        frames, size = limits.get("max_messages_per_minute"), limits.get("max_bytes_per_minute")
        if not frames or not size:
            self._rates = None
            return
        rates = (BUDGET_SHARE * frames / 60.0, BUDGET_SHARE * size / 60.0)
        caps = (max(1.0, rates[0] * BURST_SECONDS), rates[1] * BURST_SECONDS)
        if self._rates is None:  # the first limits: start with a full burst
            self._tokens = list(caps)
        else:  # new limits (a welcome again): what is left carries over, within the new burst
            self._refill()
            self._tokens = [min(t, c) for t, c in zip(self._tokens, caps, strict=True)]
        self._rates, self._caps, self._at = rates, caps, self._clock()

    def _refill(self) -> None:
        now = self._clock()
        if self._rates is not None:
            elapsed = now - self._at
            self._tokens = [
                min(c, t + r * elapsed) for t, r, c in zip(self._tokens, self._rates, self._caps, strict=True)
            ]
        self._at = now

    def delay(self, size: int) -> float:
        """Seconds until a frame of `size` bytes may go (0: now)."""
        if self._rates is None:
            return 0.0
        self._refill()
        need = (1.0, min(float(size), self._caps[1]))
        return max(max(0.0, n - t) / r for n, t, r in zip(need, self._tokens, self._rates, strict=True))

    def spend(self, size: int) -> None:
        """A frame of `size` bytes went out (the buckets may go below zero: the next frames wait)."""
        if self._rates is None:
            return
        self._refill()
        self._tokens = [self._tokens[0] - 1.0, self._tokens[1] - min(float(size), self._caps[1])]


#: Close codes after which retrying cannot help.
REFUSALS = {
    protocol.CLOSE_UNAUTHENTICATED: "the server does not accept this token (4401): check --token / SAPO_TOKEN",
    protocol.CLOSE_BANNED: "this node or its contributor is banned (4403)",
    protocol.CLOSE_UNKNOWN_SWARM: "the site has no such swarm (4404): check --swarm",
    protocol.CLOSE_SWARM_RETIRED: "this swarm is retired (4410): pick an open one with --swarm",
}

#: The limits that shape a frame, the protocol's defaults until the server's `welcome.limits` arrive.
#: The budgets (messages, bytes per minute) pace the node only once the server has announced them.
SHAPE_LIMITS = (
    "max_frame_bytes",
    "max_groups_per_message",
    "max_completions_per_group",
    "max_chars_per_completion",
    "max_sample_n",
    "max_used_per_report",
)
DEFAULT_LIMITS = {name: protocol.DEFAULT_LIMITS[name] for name in SHAPE_LIMITS}

#: Errors that condemn the groups of a single-group share frame (resending would fail again).
FATAL_SHARE_ERRORS = {
    protocol.INVALID_MESSAGE,
    protocol.FRAME_TOO_LARGE,
    protocol.TOO_MANY_GROUPS,
    protocol.TOO_MANY_COMPLETIONS,
    protocol.COMPLETION_TOO_LONG,
}
#: Errors that mean "not now": the refused frame is sent again after this many seconds.
BACKOFF_ERRORS = {
    protocol.RATE_LIMITED: 5.0,
    protocol.OVER_BUDGET: 60.0,
    protocol.SWARM_PAUSED: 60.0,
    protocol.INTERNAL_ERROR: 5.0,
}
#: What writing to the outbox raises on a full (or failing) disk.
DISK_ERRORS = (sqlite3.Error, OSError)
#: At most this many groups wait in memory for a disk that cannot take them (the oldest are dropped).
MAX_UNWRITTEN = 10_000


def _storable(text: str) -> bool:
    """Whether the server can store `text` (its rule for every text of a share): no NUL character
    (PostgreSQL text cannot hold one) and no unpaired surrogate (it cannot be encoded as UTF-8)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class WebSocketTransport(Transport):
    def __init__(
        self,
        url: str,
        token: str | None,
        outbox_path: str | Path,
        *,
        buffer_size: int = 8,
        max_buffer_size: int | None = None,
        backoff_min: float = BACKOFF_MIN,
        backoff_max: float = BACKOFF_MAX,
        poll_interval: float = 2.0,
        open_timeout: float = OPEN_TIMEOUT,
        welcome_timeout: float | None = None,
    ) -> None:
        self.url, self._token = url, token
        self.outbox = Outbox(outbox_path)
        self.buffer_size = buffer_size
        # The buffer kept now (docs/node.md, step 5): buffer_size, doubled each time a round leaves it
        # less than half full or finds it short, up to max_sample_n or `max_buffer_size`, and halved
        # back while the pool cannot fill requests (`take_external`, `_on_samples`). A node playing
        # several rounds per sample frame its budget allows asks for more groups per frame instead of
        # going without; one whose rounds outlast the poll interval never drains it and keeps
        # buffer_size. The experiment runner bounds it to buffer_size: its nodes' J groups are the
        # pool's as it was after their previous turn (docs/experiment.md).
        self.target = buffer_size
        self.max_buffer_size = max_buffer_size
        self.backoff_min, self.backoff_max = backoff_min, backoff_max
        self.poll_interval, self.open_timeout = poll_interval, open_timeout
        self.welcome_timeout = WELCOME_TIMEOUT if welcome_timeout is None else welcome_timeout

        self.limits: dict[str, int] = dict(DEFAULT_LIMITS)
        self.node_name: str | None = None
        self.last_error: str | None = None
        self.share_frames = 0  # frames sent, for diagnostics and tests
        self.pacer = FramePacer()  # kept across connections: the server's budgets are per node
        self._state = "idle"
        self._thin = False  # the last samples reply brought fewer than half the groups asked for
        self._refill_now = False  # take_external drained the buffer: ask before the next poll
        self._catalogue: Catalogue | None = None
        self._hello: Hello | None = None
        self.swarm: dict[str, Any] = {}  # the welcome's `swarm` (slug, state, catalogue_version, ...)
        self._paused = False  # the swarm is paused: nothing is shared or sampled until it opens
        self._refusal = ""  # the server's words for a swarm refusal (the open swarms), shown with its close
        self._buffer: collections.deque[Group] = collections.deque()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._reports: collections.deque[dict[str, Any]] = collections.deque(maxlen=64)
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        # Shared groups the outbox could not take yet, with the swarm each was made for (under _lock).
        self._unwritten: list[tuple[str | None, dict[str, Any]]] = []
        self._groups_for: str | None = None  # the swarm the node's groups are made for now (under _lock)
        self._retired: set[str] = set()  # swarms learned retired: their groups are dropped (under _lock)
        self._unsorted = False  # the welcome's swarm has yet to claim the groups queued with none
        self._verdicts: dict[str, tuple[str, str | None]] = {}  # verdicts it could not record yet
        self._disk_failing = False
        self._last_counts = TransportCounts()
        self._ever_welcomed = False  # a session of this transport opened at some point
        self._challenge: str | None = None  # the newest of welcome.challenge and ack.challenge
        self._uploader: CheckpointUploader | None = None  # answers audits once `answer_audits` is called
        self._kept_weights: set[str] = set()  # the commitments on disk when audits began to be answered
        self.gate = PauseGate()  # the node's (attach_gate): held for protocol.PAUSE_SITE by the site
        self.gate.on_change = self._gate_changed
        self._node_state = protocol.NODE_PREPARING  # tell_state's, for the server's `status`
        self._figures: dict[str, float | None] = {"round_seconds": None, "tokens_per_second": None}
        self._preparing: Preparing | None = None  # tell_state's, while the state is preparing
        self._status_due = True  # something changed since the last `status` went
        self._status_at = 0.0  # when the last one went (monotonic)
        self._takes_status = False  # the last welcome had "paused": this server takes `status` frames
        self._told_upgrade = False
        self._heldout: protocol.WireHeldoutCheck | None = None  # asked, not taken yet (under _lock)
        self._heldout_answers: collections.deque[dict[str, Any]] = collections.deque(maxlen=4)

    # ------------------------------------------------------------------ the training thread's side
    def start(self, hello: Hello) -> None:
        self._hello = hello
        self._groups_for = hello.swarm if hello.swarm != protocol.ANY_SWARM else None
        self._state = "connecting"
        self._thread = threading.Thread(target=self._thread_main, name="sapo-transport", daemon=True)
        self._thread.start()

    def attach_gate(self, gate: PauseGate) -> None:
        self.gate.on_change = None
        if self.gate.paused and protocol.PAUSE_SITE in self.gate.reasons:  # a welcome came first
            gate.pause(protocol.PAUSE_SITE)
        self.gate = gate
        gate.on_change = self._gate_changed

    def tell_state(
        self,
        state: str,
        *,
        round_seconds: float | None = None,
        tokens_per_second: float | None = None,
        preparing: Preparing | None = None,
    ) -> None:
        figures = self._figures
        if round_seconds is not None or tokens_per_second is not None:
            figures = {"round_seconds": round_seconds, "tokens_per_second": tokens_per_second}
        preparing = preparing if state == protocol.NODE_PREPARING else None
        if state != self._node_state or figures != self._figures or preparing != self._preparing:
            self._node_state, self._figures, self._preparing = state, figures, preparing
            self._status_due = True
            self._poke()

    def _gate_changed(self, reasons: frozenset[str]) -> None:
        self._status_due = True
        self._poke()

    def share(self, groups: list[Group]) -> None:
        with self._lock:
            self._unwritten.extend((self._groups_for, g.to_wire()) for g in groups)
            if len(self._unwritten) > MAX_UNWRITTEN:
                log.warning("dropping %d groups the full disk could not take", len(self._unwritten) - MAX_UNWRITTEN)
                del self._unwritten[:-MAX_UNWRITTEN]
        self._write_back(verdicts=False)  # a full disk must not stop training: the groups wait in memory
        self._poke()

    def _write_back(self, *, verdicts: bool = True) -> None:
        """Write what waits in memory (groups, then verdicts: only the network thread touches those) to
        the outbox; on a disk error it waits on. A group queued before any swarm was known is the
        swarm's known now; a retired swarm's groups are dropped once written."""
        try:
            with self._lock:
                by_swarm: dict[str | None, list[dict[str, Any]]] = {}
                for swarm, rollout in self._unwritten:
                    by_swarm.setdefault(swarm or self._groups_for, []).append(rollout)
                for swarm, rollouts in by_swarm.items():
                    self.outbox.put(rollouts, swarm)
                self._unwritten = []
                retired = self._retired & set(by_swarm)
            for swarm in retired:
                self.outbox.drop_swarm(swarm)
            for id_, (state, reason) in list(self._verdicts.items()) if verdicts else ():
                self.outbox.mark(id_, state, reason)
                del self._verdicts[id_]
        except DISK_ERRORS as exc:
            self._disk_failed(exc)
            return
        if self._disk_failing and not self._unwritten and not (verdicts and self._verdicts):
            self._disk_failing = False
            log.warning("the outbox can be written again: what waited in memory is written, sharing goes on")

    def _disk_failed(self, exc: BaseException) -> None:
        if not self._disk_failing:
            self._disk_failing = True
            log.error(
                "the outbox cannot be written (%s: %s; a full disk?): groups and verdicts wait in memory, "
                "and are written once it can be",
                type(exc).__name__,
                exc,
            )

    def _mark(self, id_: str, state: str, reason: str | None = None) -> bool:
        """Record a verdict (outbox.mark), in memory when the disk cannot take it."""
        if not self._verdicts:
            try:
                return self.outbox.mark(id_, state, reason)
            except DISK_ERRORS as exc:
                self._disk_failed(exc)
        self._verdicts[id_] = (state, reason)
        return True

    def _rekey(self, id_: str) -> None:
        """The pool refused the group's id and holds no group of it (`bad_id`): it goes again under a
        fresh one."""
        try:
            new = self.outbox.rekey(id_)
        except DISK_ERRORS as exc:
            self._disk_failed(exc)  # it stays pending under its old id, refused again at the next send
            return
        if new is not None:
            log.info("group %s shared again as %s (the pool takes UUIDv7 ids of the last days)", id_, new)

    def take_external(self, max_n: int) -> list[Group]:
        with self._lock:
            taken = [self._buffer.popleft() for _ in range(min(max_n, len(self._buffer)))]
            drained = len(self._buffer) < max(self.target, 1) // 2
            if (drained or len(taken) < max_n) and not self._thin:  # rounds outrun the polls
                most = self.limits["max_sample_n"] if self.max_buffer_size is None else self.max_buffer_size
                self.target = max(self.target, min(2 * self.target, most))
        if drained and taken and not self._thin:
            # A round took what the buffer held: ask again now rather than at the next poll (a fast
            # node plays several rounds per poll interval; the pacer still bounds the requests).
            self._refill_now = True
            self._poke()
        return taken

    def report(self, report: dict[str, Any]) -> None:
        self._reports.append(dict(report))
        self._poke()

    def heldout_check(self) -> protocol.WireHeldoutCheck | None:
        with self._lock:
            check, self._heldout = self._heldout, None
        return check

    def answer_heldout(self, check: protocol.WireHeldoutCheck, *, round: int, texts: list[str]) -> None:
        answers = [{"id": q.id, "text": t} for q, t in zip(check.questions, texts, strict=True)]
        self._heldout_answers.append(
            protocol.frame(protocol.HELDOUT_ANSWERS, check=str(check.check), round=round, answers=answers)
        )
        self._poke()

    @property
    def status(self) -> str:
        return self._state

    def catalogue(self) -> Catalogue | None:
        return self._catalogue

    def counts(self) -> TransportCounts:
        try:
            c = self.outbox.counts()
        except DISK_ERRORS:  # the last counts read, while the disk fails
            return self._last_counts
        self._last_counts = TransportCounts(
            accepted=c[ACCEPTED], rejected=c[REJECTED], pending=c[PENDING], refused=c[REFUSED]
        )
        return self._last_counts

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def challenge(self) -> str | None:
        return self._challenge

    def unsettled_weights(self) -> set[str]:
        with self._lock:
            waiting = {r["proof"]["weights"] for _, r in self._unwritten if r.get("proof")}
        try:
            return waiting | self.outbox.pending_weights()
        except DISK_ERRORS:  # keep every commitment while the outbox cannot be read
            return waiting | set(self._kept_weights)

    def answer_audits(self, store: CommitmentStore) -> None:
        self._kept_weights = set(store.files())
        self._uploader = CheckpointUploader(http_base(self.url), self._token, store)

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        # Shares until the pool has answered them; reports until they are written, while connected
        # (a report is best effort: it is not kept for a later connection); an audit's upload until it
        # ends (a node's first weights are always audited, often in the ack of its last round).
        while (
            self._pending_here()
            or self._unwritten
            or (self._reports and self._state == "connected")
            or (self._uploader is not None and not self._uploader.idle())
        ):
            # A paused node sends nothing: what waits stays in the outbox for after the pause.
            if time.monotonic() >= deadline or self._state.startswith("refused") or self.gate.paused:
                return False
            self._poke()
            time.sleep(0.05)
        return True

    def _pending_here(self) -> int:
        """Groups pending for the node's swarm (those of other swarms wait for the node to join them)."""
        try:
            return self.outbox.waiting().get(self._groups_for, 0)
        except DISK_ERRORS:
            return self._last_counts.pending

    def close(self) -> None:
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            loop, task = self._loop, self._main_task
            if self._thread.is_alive() and loop is not None and task is not None:
                # Still opening a socket or waiting for a welcome (up to OPEN_TIMEOUT / WELCOME_TIMEOUT): stop now.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
                self._thread.join(timeout=5.0)
        self._state = "closed" if not self._state.startswith("refused") else self._state
        if self._uploader is not None:
            self._uploader.close()
        self.outbox.close()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already stopped
                loop.call_soon_threadsafe(wake.set)

    # ------------------------------------------------------------------ the network thread
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except asyncio.CancelledError:  # close() stopped a connection attempt
            pass
        except Exception:  # never let the thread die silently
            log.exception("the transport thread stopped")
            self._state = "stopped (error)"

    async def _main(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        self._main_task = asyncio.current_task()
        delay = self.backoff_min
        while not self._stop.is_set():
            self._state = "connecting"
            code = await self._connect_once()
            self._connected.clear()
            if self._stop.is_set():
                break
            if code == protocol.CLOSE_SWARM_RETIRED:
                self._swarm_retired()
            if code in REFUSALS:
                self._state = f"refused ({code})"
                why = self._refusal or self.last_error
                log.error("%s [%s]; not retrying, training goes on in silo", self._refusal_advice(code), why)
                return
            # 4503: the server is up but its database or Redis is not; the pause goes on doubling, so a
            # crowd of nodes does not hammer a server that is recovering.
            if self._was_welcomed:  # a session opened: the next pause starts short again
                delay = self.backoff_min
            self._state = "retrying"
            pause = retry_pause(delay)
            if code == protocol.CLOSE_TRY_AGAIN:
                log.warning("%s cannot open a session now (%s); retrying in %.1f s", self.url, code, pause)
            else:
                log.warning("connection to %s lost (%s); retrying in %.1f s", self.url, self.last_error, pause)
            await self._sleep(pause)
            delay = min(delay * 2, self.backoff_max)

    def _refusal_advice(self, code: int) -> str:
        """What a refusal means and what to do. A token this server took before (it welcomed this node, in
        this run or an earlier one on the same outbox) was revoked, or the site was restored from a
        backup older than the node's registration: the node needs a new token, and what it holds waits."""
        if code != protocol.CLOSE_UNAUTHENTICATED:
            return REFUSALS[code]
        known = self._ever_welcomed
        with contextlib.suppress(*DISK_ERRORS):
            known = known or self.outbox.epoch(self.url) is not None
        if not known:
            return REFUSALS[code]
        counts = self.counts()
        out = shlex.quote(str(self.outbox.path.parent))
        return (
            f"the server does not accept this token (4401), though it welcomed this node before: the token was "
            f"revoked, or the site was restored from a backup made before this node was registered. Nothing this "
            f"node shared is lost: {self.outbox.path} keeps the {counts.pending} groups waiting for the server "
            f"and the {counts.accepted} it acknowledged. Ask the node's owner for a new token (registering the "
            f"node again if the site no longer lists it), then run `sapo-node run --resume --out {out} --server "
            f"{self.url} --token NEW_TOKEN`: the waiting groups go out under the new token, and after a restore "
            f"those acknowledged in the last {ACK_RETENTION_SECONDS // 86_400} days go again"
        )

    async def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and time.monotonic() < deadline:
            assert self._wake is not None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, deadline - time.monotonic()))

    async def _connect_once(self) -> int | None:
        """One connection, from opening to its end; returns the close code it ended with."""
        self._was_welcomed = False
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        ws: ClientConnection | None = None
        try:
            ws = await connect(
                self.url,
                additional_headers=headers,
                open_timeout=self.open_timeout,
                max_size=None,
                user_agent_header=f"sapo-node/{__version__}",
                proxy=None,
            )
            await self._session(ws)
        except InvalidStatus as exc:  # refused at the HTTP upgrade
            status = exc.response.status_code
            self.last_error = f"HTTP {status}"
            return protocol.HTTP_REFUSALS.get(status)
        except (OSError, TimeoutError, WebSocketException, ValueError, sqlite3.Error) as exc:
            self.last_error = exc.__class__.__name__ + (f": {exc}" if str(exc) else "")
        finally:
            if ws is not None:
                await ws.close()
        if ws is None:
            return None
        if ws.close_code is not None and ws.close_code != 1000:
            self.last_error = f"closed with code {ws.close_code}"
        return ws.close_code

    async def _session(self, ws: ClientConnection) -> None:
        assert self._hello is not None
        self._inflight: dict[str, list[str]] = {}  # share frame ref -> ids awaiting their verdict
        self._solo: set[str] = set()  # ids of a frame the server refused whole: sent alone next time
        self._sample_pending_since: float | None = None
        self._sample_ref: str | None = None
        self._sample_n = 0
        self._next_sample = 0.0
        self._next_share = 0.0
        self._ref = 0
        self._welcome = asyncio.Event()
        self._forget_heldout()
        await self._send(ws, self._hello.to_wire())
        tasks = [asyncio.create_task(self._reader(ws)), asyncio.create_task(self._writer(ws))]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        # Both may have ended together (the connection dropped under the reader and a send at once):
        # take every outcome, so no exception is left "never retrieved" for the garbage collector to
        # log at some later moment, and re-raise the first.
        errors = [task.exception() for task in done if not task.cancelled()]
        for error in errors:
            if error is not None:
                raise error

    def _next_ref(self) -> str:
        self._ref += 1
        return str(self._ref)

    async def _reader(self, ws: ClientConnection) -> None:
        async for raw in ws:
            try:
                frame = json.loads(raw)
                kind = frame.get("type")
            except (ValueError, AttributeError):
                log.warning("ignoring a frame that is not a JSON object")
                continue
            handler = self._ON_SERVER_MESSAGE.get(kind)
            if handler is None:  # a newer server's message: nothing this client can do with it
                log.debug("ignoring a frame of unknown type %r", kind)
            else:
                handler(self, frame)
            self._poke()

    async def _writer(self, ws: ClientConnection) -> None:
        await asyncio.wait_for(self._welcome.wait(), timeout=self.welcome_timeout)
        assert self._wake is not None
        while not self._stop.is_set():
            self._wake.clear()
            if self._unwritten or self._verdicts:
                self._write_back()
            if self._takes_status and (self._status_due or time.monotonic() - self._status_at >= STATUS_EVERY_SECONDS):
                await self._send_status(ws)
            if not self._paused and not self.gate.paused:  # a paused node keeps its outbox for later
                await self._send_shares(ws)
                await self._request_samples(ws)
                # A paused swarm refuses reports too: they wait and go merged into one once it opens.
                if self._reports and time.monotonic() >= self._next_share:  # not while backing off
                    await self._send(ws, protocol.frame(protocol.REPORT, **self._merged_report()))
            while self._heldout_answers:  # due by a deadline: sent whatever the pauses
                await self._send(ws, self._heldout_answers.popleft())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_interval)

    # ------------------------------------------------------------------ frames
    async def _send(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        """Send a frame when the pacer allows it (waiting meanwhile, unless the node is stopping)."""
        text = json.dumps(frame)
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        delay = self.pacer.delay(size)
        if delay > 0:
            await self._sleep(delay)  # returns early only when the node stops
        self.pacer.spend(size)
        await ws.send(text)

    async def _send_status(self, ws: ClientConnection) -> None:
        self._status_due = False
        self._status_at = time.monotonic()
        figures = {k: v for k, v in self._figures.items() if v is not None}
        reasons = sorted(self.gate.reasons)[: protocol.MAX_PAUSE_REASONS]
        if self._preparing is not None:
            figures.update(self._preparing.to_wire())
        await self._send(ws, protocol.frame(protocol.STATUS, state=self._node_state, paused_for=reasons, **figures))

    def _merged_report(self) -> dict[str, Any]:
        """The queued reports as one (taken off the queue): the newest round's figures and the `used`
        ids of them all, in order, once each, at most `max_used_per_report`; ids past that stay queued
        in a copy of the same report (sending a round again replaces its figures, docs/protocol.md).
        A node paced by its budgets reports once for the rounds it made meanwhile."""
        reports = list(self._reports)
        self._reports.clear()
        merged = dict(reports[-1])
        used = list(dict.fromkeys(i for r in reports for i in r.get("used") or ()))
        cap = max(1, self.limits["max_used_per_report"])
        if "used" in merged or used:
            merged["used"] = used[:cap]
        if len(used) > cap:
            self._reports.append(dict(merged, used=used[cap:]))
        return merged

    def _on_welcome(self, frame: dict[str, Any]) -> None:
        try:
            self._catalogue = Catalogue.from_json(frame["catalogue"])
        except (KeyError, TypeError, ValueError):
            log.warning("the server's welcome has no usable catalogue; keeping the current one")
        self.limits.update({k: int(v) for k, v in (frame.get("limits") or {}).items() if isinstance(v, (int, float))})
        self.pacer.configure(self.limits)
        self.node_name = frame.get("node_name")
        self.swarm = frame.get("swarm") if isinstance(frame.get("swarm"), dict) else {}
        self._paused = self.swarm.get("state") == protocol.STATE_PAUSED
        slug = self.swarm.get("slug")
        self._groups_joined(slug if isinstance(slug, str) and slug else None)
        self._on_pool_epoch(frame.get("pool_epoch"))
        self._on_challenge(frame)
        server_time = frame.get("server_time")
        if isinstance(server_time, (int, float)) and not isinstance(server_time, bool) and server_time > 0:
            offset = clock_set(server_time)
            if abs(offset) > 60:
                log.warning("this machine's clock is %+.0f s off the server's: group ids follow the server's", -offset)
        self._takes_status = "paused" in frame
        if self._takes_status:
            self._on_pause(frame)
        self._status_due = True  # a new session: the server hears the node's state at once
        latest = newer_client(frame.get("latest_client"))
        if latest is not None and not self._told_upgrade:
            self._told_upgrade = True
            log.warning(UPGRADE_LINE.format(latest=latest, current=__version__))
        self._was_welcomed = self._ever_welcomed = True
        self._state = "paused" if self._paused else "connected"
        self._welcome.set()
        self._connected.set()

    def _on_challenge(self, frame: dict[str, Any]) -> None:
        """A welcome or a share's ack: its challenge (the next round's questions come from it) and the
        audits it asks for (uploaded by the CheckpointUploader, held from now on)."""
        if self._uploader is not None and "audits" in frame:
            self._uploader.request(parse_audits(frame["audits"]))
        challenge = frame.get("challenge")
        if isinstance(challenge, str) and 0 < len(challenge) <= proof.MAX_CHALLENGE_CHARS:
            self._challenge = challenge

    def _groups_joined(self, swarm: str | None) -> None:
        """The welcome named `swarm` (None: a server without swarms): the node's groups are made for it
        from now on."""
        with self._lock:
            self._groups_for = swarm
        self._unsorted = True
        self._sort_groups()

    def _sort_groups(self) -> None:
        """Give the welcome's swarm the groups queued before any swarm was known, and say in one line how
        many wait for other swarms. On a disk error it is tried again before the next share frame."""
        swarm = self._groups_for
        try:
            if swarm is not None:
                self.outbox.claim(swarm)
            elsewhere = {s: n for s, n in self.outbox.waiting().items() if s != swarm}
        except DISK_ERRORS as exc:
            self._disk_failed(exc)
            return
        self._unsorted = False
        if elsewhere:
            log.warning(
                "shared groups wait for swarms this node is not in (it is in %r): %s; a group goes only to the "
                "swarm it was made for, and these go when the node joins theirs again",
                swarm,
                ", ".join(f"{n} for {s!r}" for s, n in sorted(elsewhere.items(), key=lambda item: str(item[0]))),
            )

    def _swarm_retired(self) -> None:
        """The node's swarm is retired: its pending groups are dropped (once, with one line), and so are
        those it makes from now on (`_write_back`); none is shared into another swarm."""
        with self._lock:
            swarm = self._groups_for
            if swarm is None or swarm in self._retired:
                return
            self._retired.add(swarm)
        try:
            self.outbox.claim(swarm)  # groups of an older client's file: the swarm its first hello named
            dropped = self.outbox.drop_swarm(swarm)
        except DISK_ERRORS as exc:  # they stay pending for the retired swarm: never sent anywhere
            self._disk_failed(exc)
            return
        log.warning(
            "%d shared groups of swarm %r dropped: the swarm is retired, and a group is never shared into "
            "another swarm (groups made from now on are dropped too)",
            dropped,
            swarm,
        )

    def _on_pool_epoch(self, epoch: Any) -> None:
        """A new epoch: the server's database was restored from a backup (platform/sockets/epoch.py), and may
        have lost groups it acknowledged; those of the retention period are sent again."""
        if not isinstance(epoch, str) or not epoch:
            return
        try:
            known = self.outbox.epoch(self.url)
            if known is not None and known != epoch:
                again = self.outbox.requeue_acknowledged(time.time() - ACK_RETENTION_SECONDS)
                log.warning(
                    "the pool was restored from a backup (its epoch changed): sending again the %d groups it "
                    "acknowledged in the last %d days",
                    again,
                    ACK_RETENTION_SECONDS // 86_400,
                )
            if known != epoch:
                self.outbox.set_epoch(self.url, epoch)
        except DISK_ERRORS as exc:  # tried again at the next welcome
            self._disk_failed(exc)

    def _on_ack(self, frame: dict[str, Any]) -> None:
        """An ack of a share settles its groups; an ack of a report carries nothing to act on."""
        if frame.get("for") == protocol.SHARE:
            self._on_share_ack(frame)

    def _on_share_ack(self, frame: dict[str, Any]) -> None:
        self._on_challenge(frame)  # first: an audit holds its file before the verdicts release it
        for id_ in frame.get("accepted") or []:
            self._mark(str(id_), ACCEPTED)
        for item in frame.get("rejected") or []:
            if isinstance(item, dict) and item.get("reason") == protocol.BAD_ID:
                self._rekey(str(item.get("id")))
            elif isinstance(item, dict) and self._mark(str(item.get("id")), REJECTED, str(item.get("reason"))):
                log.warning("the pool rejected group %s: %s", item.get("id"), item.get("reason"))
        self._inflight.pop(str(frame.get("ref")), None)

    def _on_samples(self, frame: dict[str, Any]) -> None:
        self._sample_pending_since = None
        rollouts = frame.get("rollouts") or []
        added = 0
        with self._lock:
            for raw in rollouts:
                try:
                    group = Group.from_wire(raw)
                except ValueError as exc:
                    log.warning("ignoring a sampled group: %s", exc)
                    continue
                if group.id in self._seen:
                    continue
                self._seen[group.id] = None
                if len(self._seen) > 100_000:
                    self._seen.popitem(last=False)
                self._buffer.append(group)
                added += 1
            while len(self._buffer) > max(self.target, 1) * 2:
                self._buffer.popleft()  # keep the freshest
            # A pool that could not fill the request with groups this node has not seen (fewer than half
            # of them new: draws are uniform over the window, so some were seen before once a node has
            # taken a fair share of a small pool) has little new for a while: ask less often, and for less.
            thin = self._thin = 2 * added < self._sample_n
            if thin:
                self.target = max(self.buffer_size, self.target // 2)
        self._next_sample = time.monotonic() + self.poll_interval * (5 if thin else 1)

    def _on_swarm_state(self, frame: dict[str, Any]) -> None:
        """The swarm was paused (train in silo, share nothing), opened again, or retired (the close follows)."""
        state, detail = frame.get("state"), str(frame.get("detail") or "")[:300]
        self._paused = state == protocol.STATE_PAUSED
        if state == protocol.STATE_RETIRED:
            self._refusal = detail
            self._swarm_retired()
        elif self._was_welcomed:
            self._state = "paused" if self._paused else "connected"
        log.warning("%s", detail)

    def _on_pause(self, frame: dict[str, Any]) -> None:
        """The owner paused the node from the site, or resumed it (a welcome's `paused` says the same)."""
        if frame.get("paused") is True:
            self.gate.pause(protocol.PAUSE_SITE)
        elif frame.get("paused") is False:
            self.gate.resume(protocol.PAUSE_SITE)

    def _on_heldout_check(self, frame: dict[str, Any]) -> None:
        """A held-out check: kept for the loop to answer between rounds (sapo_node.heldout_check); a newer
        one replaces it. One outside the protocol's bounds is ignored."""
        fields = {k: v for k, v in frame.items() if k not in ("type", "v", "ref")}
        try:
            check = msgspec.convert(fields, protocol.WireHeldoutCheck, strict=False)
        except msgspec.ValidationError as exc:
            log.warning("ignoring a held-out check: %s", exc)
            return
        if not (
            0 < len(check.questions) <= protocol.HELDOUT_MAX_QUESTIONS
            and 0 < check.max_new_tokens <= protocol.HELDOUT_MAX_NEW_TOKENS
            and all(len(q.question) <= self.limits["max_chars_per_completion"] for q in check.questions)
        ):
            log.warning("ignoring a held-out check outside the protocol's bounds")
            return
        with self._lock:
            self._heldout = check

    def _forget_heldout(self) -> None:
        """A new socket: a check belongs to the socket that asked it (another refuses its answers as
        heldout_unasked), so the one not taken yet and the answers not sent yet are dropped."""
        with self._lock:
            self._heldout = None
        self._heldout_answers.clear()

    def _on_error(self, frame: dict[str, Any]) -> None:
        code, ref = str(frame.get("code")), str(frame.get("ref"))
        log.warning("the server answered error %s: %s", code, frame.get("detail"))
        if code in (protocol.UNKNOWN_SWARM, protocol.SWARM_RETIRED):  # the close that follows says the rest
            self._refusal = str(frame.get("detail") or "")[:300]
        if code == protocol.SWARM_RETIRED:
            self._swarm_retired()
        if code in BACKOFF_ERRORS:  # slow down everything; the refused frame is simply sent again later
            self._next_share = self._next_sample = time.monotonic() + max(BACKOFF_ERRORS[code], self.poll_interval * 5)
        if ref == self._sample_ref:
            self._sample_pending_since = None
        ids = self._inflight.pop(ref, None)
        if ids is None or code in BACKOFF_ERRORS:
            return
        if len(ids) > 1:
            self._solo.update(ids)  # find the culprit: resend one by one
        elif code in FATAL_SHARE_ERRORS:
            self._mark(ids[0], REJECTED, code)

    #: What each server message does: every type of protocol.SERVER_MESSAGES, checked below the class.
    _ON_SERVER_MESSAGE: ClassVar[dict[str, Callable[[WebSocketTransport, dict[str, Any]], None]]] = {
        protocol.WELCOME: _on_welcome,
        protocol.ACK: _on_ack,
        protocol.SAMPLES: _on_samples,
        protocol.ERROR: _on_error,
        protocol.SWARM_STATE: _on_swarm_state,
        protocol.PAUSE: _on_pause,
        protocol.HELDOUT_CHECK: _on_heldout_check,
    }

    async def _send_shares(self, ws: ClientConnection) -> None:
        if time.monotonic() < self._next_share:
            return
        if self._unsorted:
            self._sort_groups()
        inflight = {i for ids in self._inflight.values() for i in ids} | set(self._verdicts)
        max_groups = max(1, self.limits["max_groups_per_message"])
        max_bytes = self.limits["max_frame_bytes"] - 256
        batch: list[dict[str, Any]] = []
        size = 0
        try:
            pending = self.outbox.pending(limit=max_groups * 4, exclude=inflight, swarm=self._groups_for)
        except DISK_ERRORS as exc:
            self._disk_failed(exc)
            return
        for rollout in pending:
            reason = self._local_reason(rollout)
            if reason is not None:
                self._mark(rollout["id"], REFUSED, reason)
                log.warning("not sharing group %s: %s", rollout["id"], reason)
                continue
            n = len(json.dumps(rollout)) + 2
            alone = rollout["id"] in self._solo
            if batch and (alone or len(batch) >= max_groups or size + n > max_bytes):
                await self._send_share_frame(ws, batch)
                batch, size = [], 0
            batch.append(rollout)
            size += n
            if alone:
                await self._send_share_frame(ws, batch)
                batch, size = [], 0
        if batch:
            await self._send_share_frame(ws, batch)

    async def _send_share_frame(self, ws: ClientConnection, batch: list[dict[str, Any]]) -> None:
        ref = self._next_ref()
        self._inflight[ref] = [r["id"] for r in batch]
        await self._send(ws, protocol.frame(protocol.SHARE, ref=ref, rollouts=batch))
        self.share_frames += 1

    def _local_reason(self, rollout: dict[str, Any]) -> str | None:
        """Why the server would refuse this group outright, checked before sending it."""
        if len(rollout["completions"]) > self.limits["max_completions_per_group"]:
            return protocol.TOO_MANY_COMPLETIONS
        texts = [rollout["question"], rollout["answer"] or "", *rollout["completions"]]
        if any(len(t) > self.limits["max_chars_per_completion"] for t in texts):
            return protocol.COMPLETION_TOO_LONG
        if len(json.dumps(rollout)) + 256 > self.limits["max_frame_bytes"]:
            return protocol.FRAME_TOO_LARGE
        if not all(_storable(t) for t in texts):
            # The server refuses the whole frame (invalid_message): the group's frame-mates would be
            # resent one by one to find the culprit.
            return protocol.INVALID_MESSAGE
        return None

    async def _request_samples(self, ws: ClientConnection) -> None:
        now = time.monotonic()
        if self._sample_pending_since is not None and now - self._sample_pending_since < 30:
            return
        with self._lock:
            missing = self.target - len(self._buffer)
        if missing <= 0 or (now < self._next_sample and not self._refill_now):
            return
        self._refill_now = False
        self._sample_n = min(missing, self.limits["max_sample_n"])
        self._sample_pending_since = now
        self._sample_ref = self._next_ref()
        await self._send(ws, protocol.frame(protocol.SAMPLE, n=self._sample_n, ref=self._sample_ref))


assert set(WebSocketTransport._ON_SERVER_MESSAGE) == set(protocol.SERVER_MESSAGES), "every server message is handled"
