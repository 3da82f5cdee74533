"""A share's server path, top to bottom (docs/protocol.md, "share"): what the node socket calls for a
`share` (sockets.consumers), in order:

0. turn: the share waits for its turn (pool.turns), then goes, with the shares of other nodes that
   waited at the same time, as one batch on a database thread (`rollout_share_in_turn`);
1. budgets: the node's and its contributor's hourly storage budgets (pool.budgets), before any work;
2. verify: every group rebuilt from its task and every completion scored again (pool.verification),
   its dataset built only within the catalogue check's bounds (pool.builds);
3. screen: moderation's rules decide what is held (pool.seams, implemented by moderation), before
   anything is stored, so a held group is never sampleable; each accepted group's proof of work is
   checked against its challenge (pool.challenges), which decides its audit state;
4. store: one INSERT statement for the batch, moderation's record part of it (pool.ingest_statement);
5. answer: a verdict per group, in the order sent.

Before the steps, a group whose id breaks the id rule (a UUIDv7 of the last days: `id_fits`) leaves
its share: it is answered with its stored verdict when the pool holds its id (a resend, whatever its
id), else with `bad_id`, and nothing of it is stored or counted.

Shares of different nodes that waited for a turn together go through steps 1-5 as one batch
(`rollout_share_batch`), each answered as it would have been alone.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from common import metrics
from common.db import db_call
from common.errors import ApplicationError
from pool import audit_seam, turns
from pool.budgets import StoredBytes, storage_check
from pool.builds import ShareBuilds
from pool.challenges import proofs_check, repeats_settle
from pool.ingest_statement import NODE_HELD, ScreenedShare, SwarmOfBatch, insert_batch
from pool.limits import Limits, current_limits
from pool.models import AuditState, Rollout, Verdict
from pool.records import RolloutIn
from pool.seams import ShareToScreen, moderation
from pool.verification import Verification, verify_rollout
from sapo_node import protocol
from sapo_node.ids import is_uuid7, uuid7_floor
from sapo_node.tasks import Catalogue


@dataclass(frozen=True)
class ShareIn:
    """One node's share for `rollout_share_batch`: its groups, and the bytes its socket's previous share
    left stored (ShareResult.stored; None: the budgets are read from the database)."""

    node: Any
    rollouts: Sequence[RolloutIn]
    stored: StoredBytes | None = None


@dataclass
class ShareResult:
    accepted: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)  # [{"id", "reason"}]
    stored: StoredBytes | None = None  # after this share (the one given to rollout_share if it stored nothing)
    audits: list[dict[str, Any]] = field(default_factory=list)  # asked of the node (pool.audit_seam): its ack's
    #: The CPU seconds verifying this share took: its own (a dataset it made the server build is its cost
    #: alone), where the rest of its batch's CPU is shared by groups.
    verification_seconds: float = 0.0
    #: Of verification_seconds, what worker processes building its datasets cost (pool.builds), outside
    #: the verifying thread's CPU.
    worker_seconds: float = 0.0


@dataclass(frozen=True)
class _InTurn:
    """A share waiting for its turn, with its socket's limits, catalogue and swarm (batch-mates have the
    same: they are the turn's key)."""

    share: ShareIn
    limits: Limits
    catalogue: Catalogue
    swarm: SwarmOfBatch


async def rollout_share_in_turn(
    *, share: ShareIn, limits: Limits, catalogue: Catalogue, swarm: SwarmOfBatch, frame_cpu: float = 0.0
) -> tuple[ShareResult, float]:
    """0. turn: `rollout_share` of a node socket's share, once its turn comes (pool.turns: behind the
    shares of nodes that cost less CPU lately, together with other nodes' shares of the same limits,
    catalogue and swarm that wait at the same time), on a database thread. Returns the result and the
    share's part of its batch's CPU seconds; the node's recent CPU, which orders its next turns, grows
    by that and by `frame_cpu` (what the frame cost before: parsing it). Raises what rollout_share
    raises."""
    share_turns = turns.share_turns()
    waiting = _InTurn(share, limits, catalogue, swarm)
    result, cpu = await share_turns.share(share.node.id, waiting, _batch_in_turn, key=(limits, catalogue, swarm))
    share_turns.spent(share.node.id, frame_cpu + cpu)
    metrics.share_answered(result)
    return result, cpu


async def _batch_in_turn(batch: list[_InTurn]) -> list[tuple[ShareResult, float] | Exception]:
    """The shares whose turn came, stored together on a database thread: per share, its result and its
    part of the thread's CPU (by groups), or what it raised."""
    shares = [waiting.share for waiting in batch]
    metrics.SHARES_TOGETHER.observe(len(shares))
    first = batch[0]
    results, cpu = await db_call(_share_batch_timed, retry_lost=True)(
        shares=shares, catalogue=first.catalogue, limits=first.limits, swarm=first.swarm
    )
    groups = sum(len(share.rollouts) for share in shares) or 1
    own = [0.0 if isinstance(result, Exception) else result.verification_seconds for result in results]
    rest = max(0.0, cpu - sum(own))
    return [
        result if isinstance(result, Exception) else (result, mine + rest * len(share.rollouts) / groups)
        for share, result, mine in zip(shares, results, own, strict=True)
    ]


def _share_batch_timed(**kwargs: Any) -> tuple[list[ShareResult | Exception], float]:
    """`rollout_share_batch(**kwargs)`, and the CPU seconds its thread and its workers spent in it."""
    started = time.thread_time()
    results = rollout_share_batch(**kwargs)
    workers = sum(result.worker_seconds for result in results if isinstance(result, ShareResult))
    return results, time.thread_time() - started + workers


def rollout_share(
    *,
    node: Any,
    rollouts: Sequence[RolloutIn],
    catalogue: Catalogue,
    limits: Limits | None = None,
    stored: StoredBytes | None = None,
    swarm: SwarmOfBatch,
) -> ShareResult:
    """Verify and store a node's shared groups; answer a verdict per group, in the order sent.

    Idempotent per id: a group already stored for this node gets its stored verdict again and is not
    stored or counted twice; an id stored for another node gets `id_conflict` and nothing is stored.
    Rejected groups are stored with their reason (the contributor's inbox), their text cut short
    (REJECTED_KEEP_CHARS), and are never sampleable. Each group newly judged is counted in the node's
    NodeVerdictCounts, id conflicts as rejections (the node's trust is moderation's, counted by its
    part of the same statement), and its stored bytes in NodeStorageHour.

    Raises ApplicationError "over_budget" (nothing verified or stored) when the node or its
    contributor has used this hour's storage budget (`storage_check`; against `stored`, the previous
    share's ShareResult.stored on the same socket, when it is of this hour: one query less per share).

    The groups are stored in `swarm` (a swarm and its catalogue version), verified against
    `catalogue`, that swarm's catalogue of that version: a dataset outside it gets the verdict
    `unknown_task`.

    A batch of one of `rollout_share_batch`.
    """
    (result,) = rollout_share_batch(
        shares=[ShareIn(node=node, rollouts=rollouts, stored=stored)], catalogue=catalogue, limits=limits, swarm=swarm
    )
    if isinstance(result, Exception):
        raise result
    return result


def rollout_share_batch(
    *,
    shares: Sequence[ShareIn],
    catalogue: Catalogue,
    limits: Limits | None = None,
    swarm: SwarmOfBatch,
) -> list[ShareResult | Exception]:
    """`rollout_share` for several shares at once: what each would have answered alone, in order (a
    ShareResult, or what it would have raised: ApplicationError, the DatabaseError of a share whose
    storing failed, or a verifier's failure), at the cost of fewer, larger statements: shares of
    different nodes are verified, screened and stored together, one candidates read and one INSERT
    statement (moderation's record part of it, a transaction by itself) for all of them, so a share's
    fixed cost is paid once per batch
    (docs/benchmarks.md, "Shares stored together"). pool.turns batches the shares that wait for a turn.

    Shares are taken in order; one whose node or ids already appear in the batch starts the next one
    (so a node's shares, and a resent id, are stored one after the other, as they would be alone).
    If a batch of several fails in the database, each of its shares is tried again alone: one share's
    failure is its own. The copy rules compare a share with other nodes' groups stored before its batch
    and with its batch-mates' ahead of it, as if the shares were stored one after the other
    (docs/moderation.md, "Copies")."""
    limits = limits or current_limits()
    shares, refused = _ids_refused(shares)
    results: list[ShareResult | Exception | None] = [None] * len(shares)
    batch: list[int] = []
    nodes: set[int] = set()
    ids: set[uuid.UUID] = set()
    for i, share in enumerate(shares):
        if not share.rollouts and i in refused:  # every id refused: nothing to verify or store
            results[i] = ShareResult(stored=share.stored)
            continue
        share_ids = {r.id for r in share.rollouts}
        if share.node.id in nodes or not ids.isdisjoint(share_ids):
            _ingest_batch(shares, batch, catalogue, limits, swarm, results)
            batch, nodes, ids = [], set(), set()
        batch.append(i)
        nodes.add(share.node.id)
        ids |= share_ids
    _ingest_batch(shares, batch, catalogue, limits, swarm, results)
    if refused:
        return _with_refused(shares, results, refused)  # type: ignore[arg-type]
    return results  # type: ignore[return-value]: every place is filled


def id_fits(value: uuid.UUID, now: datetime) -> bool:
    """The id rule (docs/protocol.md, "share"): a UUIDv7 whose time is within the protocol's bounds
    around `now`. The ledger is partitioned by id ranges of months, and sampling reads the partitions
    of ids from the sampling window less ID_MAX_AGE_SECONDS (pool.selectors.window_id_floor)."""
    return _fits(value, _id_range(now))


def _id_range(now: datetime) -> tuple[int, int]:
    """[lo, hi) of the ids that fit at `now`, as integers: the floor UUIDv7s of the oldest time and of
    the millisecond after the latest."""
    oldest = now - timedelta(seconds=protocol.ID_MAX_AGE_SECONDS)
    latest = now + timedelta(seconds=protocol.ID_MAX_AHEAD_SECONDS, milliseconds=1)
    return uuid7_floor(oldest).int, uuid7_floor(latest).int


def _fits(value: uuid.UUID, bounds: tuple[int, int]) -> bool:
    return is_uuid7(value) and bounds[0] <= value.int < bounds[1]


@dataclass(frozen=True)
class _Refused:
    """A share's groups whose ids break the rule, with what the pool holds of them: (node id,
    verdict, reason) by id."""

    sent: Sequence[RolloutIn]
    stored: dict[uuid.UUID, tuple]


def _ids_refused(shares: Sequence[ShareIn]) -> tuple[list[ShareIn], dict[int, _Refused]]:
    """The shares less their groups whose ids break the rule, and those groups by share (one query
    for all of them, and none when every id fits, as with every current client)."""
    bounds = _id_range(timezone.now())
    bad = {i: [r for r in share.rollouts if not _fits(r.id, bounds)] for i, share in enumerate(shares)}
    bad = {i: rollouts for i, rollouts in bad.items() if rollouts}
    if not bad:
        return list(shares), {}
    ids = [r.id for rollouts in bad.values() for r in rollouts]
    rows = Rollout.objects.filter(id__in=ids).values_list("id", "node_id", "verdict", "reason")
    stored = {row[0]: row[1:] for row in rows}
    kept = []
    for i, share in enumerate(shares):
        out = {r.id for r in bad.get(i, ())}
        kept.append(
            share if not out else ShareIn(share.node, [r for r in share.rollouts if r.id not in out], share.stored)
        )
    return kept, {i: _Refused(shares[i].rollouts, stored) for i in bad}


def _with_refused(
    shares: Sequence[ShareIn], results: list[ShareResult | Exception], refused: dict[int, _Refused]
) -> list[ShareResult | Exception]:
    """Each share's answer with its refused ids' verdicts in place, in the order sent: a group the pool
    holds for this node gets its stored verdict, another node's `id_conflict`, any other `bad_id`."""
    out = list(results)
    for i, part in refused.items():
        result = results[i]
        if isinstance(result, Exception):
            continue
        answered = {str(r["id"]): r["reason"] for r in result.rejected}
        accepted = set(result.accepted)
        whole = ShareResult(stored=result.stored, audits=result.audits)
        for r in part.sent:
            key = str(r.id)
            if r.id in part.stored:
                node_id, verdict, reason = part.stored[r.id]
                if node_id != shares[i].node.id:
                    whole.rejected.append({"id": key, "reason": "id_conflict"})
                elif verdict == Verdict.ACCEPTED:
                    whole.accepted.append(key)
                else:
                    whole.rejected.append({"id": key, "reason": reason})
            elif key in accepted:
                whole.accepted.append(key)
            elif key in answered:
                whole.rejected.append({"id": key, "reason": answered[key]})
            else:
                whole.rejected.append({"id": key, "reason": protocol.BAD_ID})
        out[i] = whole
    return out


def _ingest_batch(
    shares: Sequence[ShareIn],
    batch: list[int],
    catalogue: Catalogue,
    limits: Limits,
    swarm: SwarmOfBatch,
    results: list[ShareResult | Exception | None],
) -> None:
    """Share `shares[i]` for each i of `batch` (different nodes, no id twice) into `results[i]`: the
    pipeline of this module's docstring. A share refused at a step gets its refusal and leaves the
    batch; when storing several fails in the database, each is stored again alone (one share's
    failure is its own)."""
    within = _within_budgets(shares, batch, limits, results)
    seconds: dict[int, tuple[float, float]] = {}
    verified = _verify(shares, within, catalogue, results, seconds)
    if not verified:
        return
    try:
        _screen_store_answer(shares, verified, swarm, results)
    except DatabaseError as exc:
        if len(verified) == 1:
            results[verified[0][0]] = exc
            return
        for one in verified:
            try:
                _screen_store_answer(shares, [one], swarm, results)
            except DatabaseError as alone:
                results[one[0]] = alone
    for i, (spent, workers) in seconds.items():
        result = results[i]
        if isinstance(result, ShareResult):
            result.verification_seconds, result.worker_seconds = spent + workers, workers


def _within_budgets(
    shares: Sequence[ShareIn], batch: list[int], limits: Limits, results: list[ShareResult | Exception | None]
) -> list[int]:
    """1. budgets: the shares whose node and contributor have storage left this hour; the others get
    "over_budget" (nothing verified or stored)."""
    within = []
    for i in batch:
        try:
            storage_check(node=shares[i].node, limits=limits, known=shares[i].stored)
        except ApplicationError as exc:
            results[i] = exc
        else:
            within.append(i)
    return within


def _verify(
    shares: Sequence[ShareIn],
    within: list[int],
    catalogue: Catalogue,
    results: list[ShareResult | Exception | None],
    seconds: dict[int, tuple[float, float]],
) -> list[tuple[int, dict[uuid.UUID, Verification]]]:
    """2. verify: each share's groups checked against their tasks, as (i, checks by id), and the CPU
    seconds each share's took into `seconds` (this thread's, its build workers'). A group whose dataset
    this share may not make the server build (pool.builds) is rejected unverified, and one of a costly
    dataset it may is verified in a bounded worker. CPU only, before the statement, so no lock waits on it.
    A resent group is verified again (resends are rare; a lookup first would cost every share a round
    trip)."""
    verified = []
    for i in within:
        started = time.thread_time()
        builds = ShareBuilds(shares[i].node.id, catalogue, shares[i].rollouts)
        try:
            with metrics.VERIFICATION_SECONDS.time():
                verified.append((i, {r.id: _verify_group(r, catalogue, builds) for r in shares[i].rollouts}))
        except Exception as exc:  # noqa: BLE001 - a verifier's failure is its share's, not its batch-mates'
            results[i] = exc
        seconds[i] = (time.thread_time() - started, builds.cpu_seconds)
    return verified


def _verify_group(rollout: RolloutIn, catalogue: Catalogue, builds: ShareBuilds) -> Verification:
    built = builds.verdict(rollout)
    return built if built is not None else verify_rollout(rollout, catalogue)


def _screen_store_answer(
    shares: Sequence[ShareIn],
    verified: list[tuple[int, dict[uuid.UUID, Verification]]],
    swarm: SwarmOfBatch,
    results: list[ShareResult | Exception | None],
) -> None:
    """3. screen, 4. store, 5. answer, for verified shares (`shares[i]` with its checks): one
    statement, a transaction by itself (inside a caller's transaction, a savepoint, so a failed
    statement leaves it usable for the retries)."""
    seam = moderation()
    # 3. Screening decides before the INSERT: what a hold rule caught is stored held, never sampleable.
    screenings = seam.rollouts_screen(
        shares=[ShareToScreen(shares[i].node.id, shares[i].rollouts, checks, swarm.swarm_id) for i, checks in verified]
    )
    audits = proofs_check([(shares[i].node, shares[i].rollouts, checks) for i, checks in verified])
    _holds_apply([(shares[i].node.id, checks) for i, checks in verified], audits)
    screened = [
        ScreenedShare(shares[i].node, shares[i].rollouts, checks, set(screening.held), audit)
        for (i, checks), screening, audit in zip(verified, screenings, audits, strict=True)
    ]
    # 4. The groups, the counters and moderation's record, in one statement.
    record = seam.rollouts_record_part(screenings=screenings)
    with transaction.atomic() if connection.in_atomic_block else nullcontext():
        inserted, stored_now = insert_batch(screened, swarm, record)
    pending = [
        i for audit in audits for i, (state, _) in audit.items() if state == AuditState.PENDING and i in inserted
    ]
    if pending:  # a question answered twice at once, on two sockets of a node: the later answer earns nothing
        repeats_settle(pending)
    seam.rollouts_recorded(screenings=screenings, inserted=inserted)
    asked = audit_seam.audits().groups_stored(inserted=inserted) if inserted else {}  # which weights to audit
    # 5. A verdict per group, in the order sent.
    existing = _stored_before(screened, inserted)
    for (i, _), share in zip(verified, screened, strict=True):
        results[i] = _answer(share, inserted, existing, stored_now, shares[i].stored)
        results[i].audits = asked.get(share.node.id, [])


def _holds_apply(
    shares: list[tuple[int, dict[uuid.UUID, Verification]]], audits: list[dict[uuid.UUID, tuple[str, str]]]
) -> None:
    """A held node's accepted groups, proof or none, go in unaudited and not sampleable
    (ingest_statement.insert_batch): decided before the INSERT, so no sample sees them in between.
    One query per batch with an accepted group."""
    nodes = {node_id for node_id, checks in shares if any(c.accepted for c in checks.values())}
    held = audit_seam.audits().nodes_held(node_ids=nodes) if nodes else set()
    for (node_id, checks), audit in zip(shares, audits, strict=True):
        if node_id in held:
            audit.update({rollout_id: NODE_HELD for rollout_id, check in checks.items() if check.accepted})


def _stored_before(screened: Sequence[ScreenedShare], inserted: set[uuid.UUID]) -> dict[uuid.UUID, tuple]:
    """(node id, verdict, reason) of the batch's ids the statement did not insert: resent, or another
    node's (one query, and none when every id was new, as nearly always)."""
    others = [r.id for share in screened for r in share.rollouts if r.id not in inserted]
    if not others:
        return {}
    rows = Rollout.objects.filter(id__in=others).values_list("id", "node_id", "verdict", "reason")
    return {row[0]: row[1:] for row in rows}


def _answer(
    share: ScreenedShare,
    inserted: set[uuid.UUID],
    existing: dict[uuid.UUID, tuple],
    stored_now: dict[int, StoredBytes],
    stored_before: StoredBytes | None,
) -> ShareResult:
    """A share's verdicts: its own for the groups just inserted, the stored one for a group it sent
    before, `id_conflict` for another node's id."""
    node = share.node
    result = ShareResult(stored=stored_now.get(node.id) or stored_before)
    for r in share.rollouts:
        if r.id in inserted:
            check = share.checks[r.id]
            node_id, verdict, reason = node.id, check.verdict, check.reason
        else:
            # Stored before this statement; gone since only if deleted in between (a moderator's
            # purge): not this node's to claim, as if another node held it.
            node_id, verdict, reason = existing.get(r.id, (None, "", ""))
        if node_id != node.id:
            result.rejected.append({"id": str(r.id), "reason": "id_conflict"})
        elif verdict == Verdict.ACCEPTED:
            result.accepted.append(str(r.id))
        else:
            result.rejected.append({"id": str(r.id), "reason": reason})
    return result
