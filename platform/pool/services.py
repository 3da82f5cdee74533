"""Writes to the pool: sharing groups (verify, store, count), moderation status, round reports,
what was served, and the storage budgets.

Every function is synchronous and runs its own transaction; consumers call them through
`database_sync_to_async`. Side effects on the channel layer happen on commit only.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.db.models import BigIntegerField, BooleanField, Case, F, Q, QuerySet, Value, When
from django.db.models.expressions import RawSQL
from django.utils import timezone

from common import metrics
from common.compact_json import dumps, dumps_floats, dumps_texts
from common.db import binary_array, prepare_hot, server_binding_cursor
from common.errors import ApplicationError
from pool.limits import Limits, current_limits
from pool.messages import Report, RolloutIn
from pool.models import (
    SAMPLE_SEQUENCE,
    Consumption,
    ModerationStatus,
    NodeRound,
    NodeStorageHour,
    Rollout,
    ServedGroup,
    Verdict,
)
from pool.seams import (
    INSERT_CTE_NAMES,
    INSERT_PARAM_NAMES,
    RecordPart,
    ShareToScreen,
    moderation,
    record_sql_check,
    sql_names,
)
from pool.signals import rollouts_moderation_changing
from pool.verification import Verification, has_variance, verify_rollout
from sapo_node import protocol
from sapo_node.tasks import Catalogue

#: A rejected group is kept for the contributor's inbox and the audit, not for training: its question,
#: answer and first REJECTED_KEEP_COMPLETIONS completions are stored cut to REJECTED_KEEP_CHARS
#: characters (so a stream of junk costs little storage), its claimed rewards in full.
REJECTED_KEEP_CHARS = 256
REJECTED_KEEP_COMPLETIONS = 4
#: What a stored row costs beyond its texts (ids, numbers, index entries), in the storage budgets.
ROW_OVERHEAD_BYTES = 200
#: Served-group rows live this long past the sampling window: a node reports what it used within
#: minutes of sampling it.
SERVED_KEEP = timedelta(days=1)
PRUNE_EVERY_SECONDS = 600


@dataclass(frozen=True)
class StoredBytes:
    """A node's bytes stored in `hour`, and its contributor's (all their nodes), as a share's INSERT
    left them: what the node's next share on the same socket checks its budgets against
    (`storage_check`), without a query of its own."""

    hour: datetime
    node: int
    owner: int


@dataclass
class ShareResult:
    accepted: list[str] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)  # [{"id", "reason"}]
    stored: StoredBytes | None = None  # after this share (the one given to rollout_share if it stored nothing)


def _owner_hour_bytes_sql(owner: str) -> str:
    """The bytes a contributor's nodes stored in an hour (the contributor's storage budget), summed over
    its nodes' rows, `owner` being the SQL that names the contributor; the pool's INSERT leaves the
    storing node's row out (it adds that row's new total itself)."""
    return f"""
SELECT coalesce(sum(o.bytes), 0) FROM pool_nodestoragehour o JOIN nodes_node n ON n.id = o.node_id
WHERE n.owner_id = {owner} AND o.hour = %(hour)s"""


# One statement per batch of shares (a share alone is a batch of one; rollout_share_batch): arrays in,
# one row per group with its node, ON CONFLICT for concurrent replays, and a sample number drawn only
# for rows that become sampleable; then each node's verdict counts and stored bytes, a row per node
# (a node appears once in a batch), upserted in node order so that concurrent batches lock those rows
# in one order. Parameters are bound server-side (psycopg's default) rather than quoted into the SQL
# text as Django's cursor does: quoting the completions was most of the ORM bulk_create's cost
# (docs/benchmarks.md, "Pool"). The arrays go in binary (%(...)b): text format escapes every element
# with a regular expression. The parts, after the INSERT:
# - counts: per node, its groups inserted, accepted and rejected;
# - conflicts: per node, the ids another node stored already (the statement's snapshot: rows inserted
#   above are not seen), counted as rejections each time they are sent; looked up only when some id
#   was not inserted (nearly every share inserts every group: the lookup then costs nothing);
# - storage: per node, its bytes: all its groups' (summed by the caller) when all were inserted
#   (nearly always), else those of the ones inserted;
# - totals: each node's bytes this hour and its contributor's (the statement's snapshot holds the other
#   nodes' rows as they were, a batch-mate's of the same contributor included, and this node's before
#   the upsert: its new total comes from the upsert); answered with each inserted id.
# No comments in the SQL itself: psycopg parses a statement longer than 4,096 bytes
# (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH) afresh at every execution, with a regular expression
# (tests/platform/test_pool_schema.py checks the length).
_INSERT_SQL = f"""
WITH inserted AS (
INSERT INTO pool_rollout (id, node_id, round, dataset, seed, index, question, answer, completions,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, created_at)
SELECT u.id, u.node, u.round, u.dataset, u.seed, u.index, u.question, u.answer, u.completions::jsonb,
       u.completion_count, u.claimed::jsonb, u.verified::jsonb, u.verdict, u.reason,
       CASE WHEN u.held THEN 'held' ELSE 'ok' END, u.has_variance, u.sampleable,
       CASE WHEN u.sampleable THEN nextval('pool_rollout_sample_seq') END, %(now)s
FROM unnest(%(id)b::uuid[], %(node)b::bigint[], %(round)b::int[], %(dataset)b::text[], %(seed)b::bigint[],
            %(index)b::bigint[], %(question)b::text[], %(answer)b::text[], %(completions)b::text[],
            %(count)b::int[], %(claimed)b::text[], %(verified)b::text[], %(verdict)b::text[], %(reason)b::text[],
            %(has_variance)b::bool[], %(sampleable)b::bool[], %(held)b::bool[])
     AS u(id, node, round, dataset, seed, index, question, answer, completions, completion_count, claimed,
          verified, verdict, reason, has_variance, sampleable, held)
ON CONFLICT (id) DO NOTHING
RETURNING id, node_id, verdict
), counts AS MATERIALIZED (
    SELECT node_id AS node, count(*) AS n,
           count(*) FILTER (WHERE verdict = 'accepted') AS a,
           count(*) FILTER (WHERE verdict <> 'accepted') AS r
    FROM inserted GROUP BY node_id
), conflicts AS MATERIALIZED (
    SELECT u.node, count(*) AS c
    FROM unnest(%(id)b::uuid[], %(node)b::bigint[]) AS u(id, node)
    JOIN pool_rollout p ON p.id = u.id AND p.node_id <> u.node
    WHERE (SELECT coalesce(sum(n), 0) FROM counts) < cardinality(%(id)b::uuid[])
    GROUP BY u.node
), verdict_counts AS (
    INSERT INTO pool_nodeverdictcounts AS t (node_id, accepted_groups, rejected_groups, updated_at)
    SELECT w.node, coalesce(c.a, 0), coalesce(c.r, 0) + coalesce(x.c, 0), now()
    FROM unnest(%(nodes)b::bigint[]) AS w(node)
    LEFT JOIN counts c ON c.node = w.node
    LEFT JOIN conflicts x ON x.node = w.node
    WHERE c.node IS NOT NULL OR x.node IS NOT NULL
    ORDER BY w.node
    ON CONFLICT (node_id) DO UPDATE SET
        accepted_groups = t.accepted_groups + EXCLUDED.accepted_groups,
        rejected_groups = t.rejected_groups + EXCLUDED.rejected_groups,
        updated_at = now()
), storage AS (
    INSERT INTO pool_nodestoragehour AS s (node_id, hour, bytes)
    SELECT c.node, %(hour)s, CASE WHEN c.n = w.sent THEN w.total_bytes ELSE (
        SELECT sum(b.bytes) FROM inserted i JOIN unnest(%(id)b::uuid[], %(bytes)b::bigint[]) AS b(id, bytes)
        ON b.id = i.id WHERE i.node_id = c.node
    ) END
    FROM counts c JOIN unnest(%(nodes)b::bigint[], %(sent)b::int[], %(total_bytes)b::bigint[])
         AS w(node, sent, total_bytes) ON w.node = c.node
    ORDER BY c.node
    ON CONFLICT (node_id, hour) DO UPDATE SET bytes = s.bytes + EXCLUDED.bytes
    RETURNING node_id, bytes
), totals AS MATERIALIZED (  -- one owner sum per node, not one per inserted row
    SELECT st.node_id, st.bytes, st.bytes + ({_owner_hour_bytes_sql("w.owner")} AND o.node_id <> st.node_id
    ) AS owner_bytes
    FROM storage st JOIN unnest(%(nodes)b::bigint[], %(owners)b::bigint[]) AS w(node, owner) ON w.node = st.node_id
){{record}}
SELECT i.id, i.node_id, t.bytes, t.owner_bytes FROM inserted i JOIN totals t ON t.node_id = i.node_id
"""

assert sql_names(_INSERT_SQL) == (set(INSERT_CTE_NAMES), set(INSERT_PARAM_NAMES)), "pool.seams declares these names"

#: The INSERT statement with a moderation's RecordSql (its CTEs after the pool's), by the record's
#: text: one text per moderation, so each is prepared once per connection.
_insert_sql: dict[str, str] = {}


def _insert_statement(record: RecordPart | None) -> str:
    ctes = record.sql.ctes if record is not None else ""
    sql = _insert_sql.get(ctes)
    if sql is None:
        if record is not None:
            record_sql_check(record.sql)  # registered ones were checked at start-up; any other here
        sql = _insert_sql[ctes] = _INSERT_SQL.replace("{record}", f", {ctes}" if ctes else "")
    return sql


def _utf8_len(text: str | None) -> int:
    if text is None:
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _kept(text: str | None) -> str | None:
    """A rejected group's text as stored: cut to REJECTED_KEEP_CHARS, with a mark where it was cut."""
    if text is None or len(text) <= REJECTED_KEEP_CHARS:
        return text
    return text[:REJECTED_KEEP_CHARS] + f"… [cut: {len(text)} characters]"


def _hour(now: datetime) -> datetime:
    return now.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class _Verified:
    """One share of a batch, verified and screened, ready for the INSERT."""

    node: Any
    rollouts: Sequence[RolloutIn]
    checks: dict[uuid.UUID, Verification]
    held: set[uuid.UUID]


def _insert_rollouts(
    shares: Sequence[_Verified], record: RecordPart | None = None
) -> tuple[set[uuid.UUID], dict[int, StoredBytes]]:
    """Insert the groups of several nodes' shares (one share per node), count their verdicts
    (NodeVerdictCounts, an id another node stored counting as a rejection) and the bytes stored this
    hour (NodeStorageHour), and write what moderation records of them (`record`), in one statement:
    one transaction by itself, or part of the caller's. Return the ids actually inserted (an id
    already stored is left alone, and neither counted nor charged again) and, per node that stored
    something, its bytes stored this hour after it. The `held` ids go in with moderation status "held"
    and not sampleable: no moment exists where a sample could see them."""
    rollouts = [r for share in shares for r in share.rollouts]
    verdicts = [share.checks[r.id] for share in shares for r in share.rollouts]
    variance = [c.accepted and has_variance(c.verified_rewards) for c in verdicts]
    holds = [r.id in share.held for share in shares for r in share.rollouts]
    questions, answers, completions = [], [], []
    for r, c in zip(rollouts, verdicts, strict=True):
        if c.accepted:
            questions.append(r.question)
            answers.append(r.answer)
            completions.append(dumps_texts(r.completions))
        else:
            questions.append(_kept(r.question))
            answers.append(_kept(r.answer))
            completions.append(dumps([_kept(t) for t in r.completions[:REJECTED_KEEP_COMPLETIONS]]))
    claimed = [dumps_floats(r.rewards) for r in rollouts]
    verified = [None if c.verified_rewards is None else dumps_floats(c.verified_rewards) for c in verdicts]
    sizes = [
        ROW_OVERHEAD_BYTES + sum(map(_utf8_len, texts))
        for texts in zip(questions, answers, completions, claimed, verified, strict=True)
    ]
    totals, start = [], 0
    for share in shares:
        totals.append(sum(sizes[start : start + len(share.rollouts)]))
        start += len(share.rollouts)
    now = timezone.now()
    hour = _hour(now)
    params = {
        "now": now,
        "hour": hour,
        "nodes": binary_array("int8", [share.node.id for share in shares]),
        "owners": binary_array("int8", [share.node.owner_id for share in shares]),
        "sent": binary_array("int4", [len(share.rollouts) for share in shares]),
        "total_bytes": binary_array("int8", totals),
        "id": binary_array("uuid", [r.id for r in rollouts]),
        "node": binary_array("int8", [share.node.id for share in shares for _ in share.rollouts]),
        "round": binary_array("int4", [r.round for r in rollouts]),
        "dataset": binary_array("text", [r.dataset for r in rollouts]),
        "seed": binary_array("int8", [r.seed for r in rollouts]),
        "index": binary_array("int8", [r.index for r in rollouts]),
        "question": binary_array("text", questions),
        "answer": binary_array("text", answers),
        "completions": binary_array("text", completions),
        "count": binary_array("int4", [len(r.completions) for r in rollouts]),
        "claimed": binary_array("text", claimed),
        "verified": binary_array("text", verified),
        "bytes": binary_array("int8", sizes),
        "verdict": binary_array("text", [c.verdict for c in verdicts]),
        "reason": binary_array("text", [c.reason for c in verdicts]),
        "has_variance": binary_array("bool", variance),
        "sampleable": binary_array("bool", [v and not h for v, h in zip(variance, holds, strict=True)]),
        "held": binary_array("bool", holds),
    }
    if record is not None:
        params.update(record.params)  # names apart from the pool's: pool.seams.record_sql_check
    # Django's errors, as its own cursors raise them (IntegrityError for a node deleted meanwhile: the
    # batch's retry catches DatabaseError).
    with connection.wrap_database_errors, server_binding_cursor() as cursor:
        cursor.execute(_insert_statement(record), params, prepare=prepare_hot())
        rows = cursor.fetchall()
    stored = {int(node): StoredBytes(hour=hour, node=int(b), owner=int(o)) for _, node, b, o in rows}
    return {row[0] for row in rows}, stored


_BUDGET_SQL = f"""
SELECT coalesce((SELECT bytes FROM pool_nodestoragehour WHERE node_id = %(node)s AND hour = %(hour)s), 0),
       ({_owner_hour_bytes_sql("%(owner)s")})
"""


def storage_check(*, node: Any, limits: Limits, now: datetime | None = None, known: StoredBytes | None = None) -> None:
    """Raise ApplicationError "over_budget" when the node, or its contributor's nodes together, have
    stored their hourly budget of bytes already. Checked before a share is verified (a node over its
    budget costs one small query per frame); the write that crosses the budget is still stored, so a
    budget is exceeded by at most one frame per open socket.

    `known`: the figures the socket's previous share left (ShareResult.stored), used instead of the
    query when they are of this hour. They can only be low (bytes are only added within an hour), and
    the share they let through brings fresh ones back with its own INSERT: the bound above holds."""
    now = now or timezone.now()
    hour = _hour(now)
    if known is not None and known.hour == hour:
        node_bytes, owner_bytes = known.node, known.owner
    else:
        with connection.cursor() as cursor:
            cursor.execute(_BUDGET_SQL, {"node": node.id, "owner": node.owner_id, "hour": hour})
            node_bytes, owner_bytes = (int(v) for v in cursor.fetchone())
    until = f"until {hour + timedelta(hours=1):%H:%M} UTC"
    if node_bytes >= limits.max_stored_bytes_per_node_hour:
        raise ApplicationError(
            protocol.OVER_BUDGET,
            f"this node stored {node_bytes} bytes this hour, its budget is "
            f"{limits.max_stored_bytes_per_node_hour}: nothing more is stored {until}",
        )
    if owner_bytes >= limits.max_stored_bytes_per_contributor_hour:
        raise ApplicationError(
            protocol.OVER_BUDGET,
            f"this contributor's nodes stored {owner_bytes} bytes this hour, the budget is "
            f"{limits.max_stored_bytes_per_contributor_hour}: nothing more is stored {until}",
        )


def _storage_charge(node_id: int, size: int, now: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pool_nodestoragehour AS s (node_id, hour, bytes) VALUES (%(node)s, %(hour)s, %(bytes)s)
            ON CONFLICT (node_id, hour) DO UPDATE SET bytes = s.bytes + EXCLUDED.bytes
            """,
            {"node": node_id, "hour": _hour(now), "bytes": size},
        )


@dataclass(frozen=True)
class ShareIn:
    """One node's share for `rollout_share_batch`: its groups, and the bytes its socket's previous share
    left stored (ShareResult.stored; None: the budgets are read from the database)."""

    node: Any
    rollouts: Sequence[RolloutIn]
    stored: StoredBytes | None = None


def rollout_share(
    *,
    node: Any,
    rollouts: Sequence[RolloutIn],
    catalogue: Catalogue,
    limits: Limits | None = None,
    stored: StoredBytes | None = None,
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

    A batch of one of `rollout_share_batch`.
    """
    (result,) = rollout_share_batch(
        shares=[ShareIn(node=node, rollouts=rollouts, stored=stored)], catalogue=catalogue, limits=limits
    )
    if isinstance(result, Exception):
        raise result
    return result


def rollout_share_batch(
    *, shares: Sequence[ShareIn], catalogue: Catalogue, limits: Limits | None = None
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
    results: list[ShareResult | Exception | None] = [None] * len(shares)
    batch: list[int] = []
    nodes: set[int] = set()
    ids: set[uuid.UUID] = set()
    for i, share in enumerate(shares):
        share_ids = {r.id for r in share.rollouts}
        if share.node.id in nodes or not ids.isdisjoint(share_ids):
            _share_together(shares, batch, catalogue, limits, results)
            batch, nodes, ids = [], set(), set()
        batch.append(i)
        nodes.add(share.node.id)
        ids |= share_ids
    _share_together(shares, batch, catalogue, limits, results)
    return results  # type: ignore[return-value]: every place is filled


def _share_together(
    shares: Sequence[ShareIn],
    batch: list[int],
    catalogue: Catalogue,
    limits: Limits,
    results: list[ShareResult | Exception | None],
) -> None:
    """Share `shares[i]` for each i of `batch` (different nodes, no id twice) in one statement, into
    `results[i]`; each alone when that fails with several."""
    live = []
    for i in batch:
        try:
            storage_check(node=shares[i].node, limits=limits, known=shares[i].stored)
        except ApplicationError as exc:
            results[i] = exc
        else:
            live.append(i)
    if not live:
        return
    # Verification is CPU only: done before the statement, so no lock waits on it. A resent
    # group is verified again (resends are rare; a lookup first would cost every share a round trip).
    verified = []
    for i in live:
        try:
            with metrics.VERIFICATION_SECONDS.time():
                verified.append((i, {r.id: verify_rollout(r, catalogue) for r in shares[i].rollouts}))
        except Exception as exc:  # noqa: BLE001 - a verifier's failure is its share's, not its batch-mates'
            results[i] = exc
    if not verified:
        return
    try:
        _store_together(shares, verified, results)
    except DatabaseError as exc:
        if len(verified) == 1:
            results[verified[0][0]] = exc
            return
        for one in verified:
            try:
                _store_together(shares, [one], results)
            except DatabaseError as alone:
                results[one[0]] = alone


def _store_together(
    shares: Sequence[ShareIn],
    verified: list[tuple[int, dict[uuid.UUID, Verification]]],
    results: list[ShareResult | Exception | None],
) -> None:
    """Screen and store verified shares (`shares[i]` with its checks) in one transaction, and answer
    each into `results[i]`."""
    seam = moderation()
    # Screening decides before the INSERT: what a hold rule caught is stored held, never sampleable.
    screenings = seam.rollouts_screen(
        shares=[ShareToScreen(shares[i].node.id, shares[i].rollouts, checks) for i, checks in verified]
    )
    together = [
        _Verified(shares[i].node, shares[i].rollouts, checks, set(screening.held))
        for (i, checks), screening in zip(verified, screenings, strict=True)
    ]
    # One statement, a transaction by itself: the groups, the counters and moderation's record. Inside
    # a caller's transaction, in a savepoint: a failed statement then leaves it usable for the retries.
    record = seam.rollouts_record_part(screenings=screenings)
    with transaction.atomic() if connection.in_atomic_block else nullcontext():
        inserted, stored_now = _insert_rollouts(together, record)
    seam.rollouts_recorded(screenings=screenings, inserted=inserted)
    others = [r.id for share in together for r in share.rollouts if r.id not in inserted]  # resent, or taken
    existing = (
        {
            row[0]: row[1:]
            for row in Rollout.objects.filter(id__in=others).values_list("id", "node_id", "verdict", "reason")
        }
        if others
        else {}
    )
    for (i, _), share in zip(verified, together, strict=True):
        node = share.node
        result = ShareResult(stored=stored_now.get(node.id) or shares[i].stored)
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
        results[i] = result


def rollout_set_moderation(*, rollouts: QuerySet[Rollout] | Iterable[uuid.UUID], status: str) -> int:
    """Set the moderation status of groups and keep `sampleable` in step; return the number changed.

    Announces the change first (pool.signals.rollouts_moderation_changing, same transaction: the
    leaderboard's folded figures move the groups' credit while the old status is still readable).
    Moving a group back to "ok" makes it sampleable again if it was accepted and has variance; a group
    sampleable for the first time gets a new sample number (drawn from the same sequence).
    """
    if status not in ModerationStatus.values:
        raise ApplicationError("invalid_status", f"unknown moderation status {status!r}")
    queryset = rollouts if isinstance(rollouts, QuerySet) else Rollout.objects.filter(id__in=list(rollouts))
    with transaction.atomic():
        rollouts_moderation_changing.send(sender=Rollout, rollouts=queryset, status=status)
        return _set_moderation(queryset, status)


def _set_moderation(queryset: QuerySet[Rollout], status: str) -> int:
    if status != ModerationStatus.OK:
        return queryset.update(moderation_status=status, sampleable=False)
    eligible = Q(verdict=Verdict.ACCEPTED, has_variance=True)
    return queryset.update(
        moderation_status=status,
        sample_seq=Case(
            When(
                eligible & Q(sample_seq__isnull=True),
                then=RawSQL("nextval(%s)", [SAMPLE_SEQUENCE], output_field=BigIntegerField()),
            ),
            default=F("sample_seq"),
            output_field=BigIntegerField(),
        ),
        sampleable=Case(When(eligible, then=Value(True)), default=Value(False), output_field=BooleanField()),
    )


def node_round_report(*, node: Any, report: Report, limits: Limits | None = None) -> NodeRound:
    """Store a node's round report (a resent round replaces the figures) and credit what it used.

    Credit is earned, not claimed: an id in `used` becomes a Consumption row (one per consumer and
    group, however often reported) only if the group is accepted, the pool served it to this node in
    a `samples` reply (ServedGroup), and its author belongs to another contributor. Anything else
    (unknown, own, rejected, never served, a sibling node's) is ignored: a contributor cannot credit
    its own groups from its other nodes, nor anyone's groups it never sampled.

    The report's bytes count against the storage budgets; raises "over_budget" past them.
    """
    storage_check(node=node, limits=limits or current_limits())
    now = timezone.now()
    with transaction.atomic():
        node_round, _ = NodeRound.objects.update_or_create(
            node=node, round=report.round, defaults={"figures": report.figures, "used_count": len(report.used)}
        )
        candidates = 0
        if report.used:
            served = ServedGroup.objects.filter(node_id=node.id, rollout_id__in=report.used).values("rollout_id")
            authors = (
                Rollout.objects.filter(id__in=served, verdict=Verdict.ACCEPTED)
                .exclude(node__owner_id=node.owner_id)
                .values_list("id", "node_id")
            )
            rows = [Consumption(consumer=node, rollout_id=r, author_id=a, round=report.round) for r, a in authors]
            Consumption.objects.bulk_create(rows, ignore_conflicts=True)
            candidates = len(rows)
        _storage_charge(node.id, ROW_OVERHEAD_BYTES * (1 + candidates) + _utf8_len(dumps(report.figures)), now)
    return node_round


def rollout_served_record(*, node: Any, rollout_ids: Sequence[uuid.UUID], now: datetime | None = None) -> None:
    """Remember that these groups were sent to the node in a `samples` reply (what makes a later
    `report.used` of them count). One statement. A group served again keeps its first time: a group is
    sampleable for the sampling window after it was shared, so a record kept for the window and a day
    after it was first served outlives every report that can name it."""
    if not rollout_ids:
        return
    now = now or timezone.now()
    with connection.cursor() as cursor:
        # Bookkeeping, not data: a database crash may lose the last moment's records (a credit or
        # two), so the commit does not wait for the disk (set_config(..., true) lasts for this
        # statement's own transaction; one round trip). Waiting made every `sample` several ms
        # slower (docs/benchmarks.md, "Pool").
        cursor.execute(
            """
            INSERT INTO pool_servedgroup (node_id, rollout_id, served_at)
            SELECT %(node)s, r, %(now)s
            FROM unnest(%(ids)s::uuid[]) AS r, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
            ON CONFLICT (node_id, rollout_id) DO NOTHING
            """,
            # The ids as one array literal (UUIDs need no quoting): psycopg's client-side binding quotes
            # each element of a list, a visible part of a `sample`'s CPU.
            {"node": node.id, "ids": "{" + ",".join(str(uuid.UUID(str(i))) for i in rollout_ids) + "}", "now": now},
        )
    _prune_if_due(now)


_prune_checked_at = -math.inf  # this process's last look at the shared cache key (time.monotonic)


def _prune_if_due(now: datetime) -> None:
    """Drop served-group rows past their use and storage counts of past hours, at most every
    PRUNE_EVERY_SECONDS across the processes (a cache key; an index range each). A process looks at
    the key at most once a second (the look cost more than the rest of a `sample`'s bookkeeping)."""
    global _prune_checked_at
    checked = time.monotonic()
    if checked - _prune_checked_at < 1.0:
        return
    _prune_checked_at = checked
    if not cache.add("pool:prune-due", 1, PRUNE_EVERY_SECONDS):
        return
    window = timedelta(seconds=current_limits().sample_window_seconds)
    ServedGroup.objects.filter(served_at__lt=now - window - SERVED_KEEP).delete()
    NodeStorageHour.objects.filter(hour__lt=_hour(now) - timedelta(hours=1)).delete()
