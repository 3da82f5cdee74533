"""A share's server path, top to bottom (docs/protocol.md, "share"): what the node socket calls when a
share's turn comes (pool.consumers through pool.turns, on a database thread), in order:

1. budgets: the node's and its contributor's hourly storage budgets (pool.budgets), before any work;
2. verify: every group rebuilt from its task and every completion scored again (pool.verification);
3. screen: moderation's rules decide what is held (pool.seams, implemented by moderation), before
   anything is stored, so a held group is never sampleable;
4. store: one INSERT statement for the batch, moderation's record part of it (pool.ingest_statement);
5. answer: a verdict per group, in the order sent.

Shares of different nodes that waited for a turn together go through it as one batch
(`rollout_share_batch`), each answered as it would have been alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connection, transaction

from common import metrics
from common.errors import ApplicationError
from pool.budgets import StoredBytes, storage_check
from pool.ingest_statement import ScreenedShare, SwarmOfBatch, insert_batch
from pool.limits import Limits, current_limits
from pool.messages import RolloutIn
from pool.models import Rollout, Verdict
from pool.seams import ShareToScreen, moderation
from pool.verification import Verification, verify_rollout
from sapo_node.tasks import Catalogue
from swarms.services import swarm_default_ensure


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


def rollout_share(
    *,
    node: Any,
    rollouts: Sequence[RolloutIn],
    catalogue: Catalogue,
    limits: Limits | None = None,
    stored: StoredBytes | None = None,
    swarm: SwarmOfBatch | None = None,
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

    The groups are stored in `swarm` (None: the site's default swarm, its current catalogue version),
    verified against `catalogue`, that swarm's catalogue of that version: a dataset outside it gets
    the verdict `unknown_task`.

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
    swarm: SwarmOfBatch | None = None,
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
    if swarm is None:
        default = swarm_default_ensure()
        swarm = SwarmOfBatch(default.id, default.catalogue_version)
    results: list[ShareResult | Exception | None] = [None] * len(shares)
    batch: list[int] = []
    nodes: set[int] = set()
    ids: set[uuid.UUID] = set()
    for i, share in enumerate(shares):
        share_ids = {r.id for r in share.rollouts}
        if share.node.id in nodes or not ids.isdisjoint(share_ids):
            _ingest_batch(shares, batch, catalogue, limits, swarm, results)
            batch, nodes, ids = [], set(), set()
        batch.append(i)
        nodes.add(share.node.id)
        ids |= share_ids
    _ingest_batch(shares, batch, catalogue, limits, swarm, results)
    return results  # type: ignore[return-value]: every place is filled


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
    verified = _verify(shares, within, catalogue, results)
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
    shares: Sequence[ShareIn], within: list[int], catalogue: Catalogue, results: list[ShareResult | Exception | None]
) -> list[tuple[int, dict[uuid.UUID, Verification]]]:
    """2. verify: each share's groups checked against their tasks, as (i, checks by id). CPU only,
    before the statement, so no lock waits on it. A resent group is verified again (resends are rare;
    a lookup first would cost every share a round trip)."""
    verified = []
    for i in within:
        try:
            with metrics.VERIFICATION_SECONDS.time():
                verified.append((i, {r.id: verify_rollout(r, catalogue) for r in shares[i].rollouts}))
        except Exception as exc:  # noqa: BLE001 - a verifier's failure is its share's, not its batch-mates'
            results[i] = exc
    return verified


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
    screened = [
        ScreenedShare(shares[i].node, shares[i].rollouts, checks, set(screening.held))
        for (i, checks), screening in zip(verified, screenings, strict=True)
    ]
    # 4. The groups, the counters and moderation's record, in one statement.
    record = seam.rollouts_record_part(screenings=screenings)
    with transaction.atomic() if connection.in_atomic_block else nullcontext():
        inserted, stored_now = insert_batch(screened, swarm, record)
    seam.rollouts_recorded(screenings=screenings, inserted=inserted)
    # 5. A verdict per group, in the order sent.
    existing = _stored_before(screened, inserted)
    for (i, _), share in zip(verified, screened, strict=True):
        results[i] = _answer(share, inserted, existing, stored_now, shares[i].stored)


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
