"""The statement that stores a batch of shares (pool.ingest): the groups, each node's verdict counts
and stored bytes, and moderation's record (pool.seams.RecordSql), in one INSERT with its CTEs."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from django.db import connection
from django.utils import timezone
from psycopg import sql

from common.compact_json import dumps, dumps_floats, dumps_texts
from common.composed import cte_list, placeholder_names, placeholders, rendered
from common.db import binary_array, prepare_hot, server_binding_cursor
from pool.budgets import ROW_OVERHEAD_BYTES, StoredBytes, hour_of, owner_hour_bytes_sql, utf8_len
from pool.models import AuditReason, AuditState
from pool.records import GROUP_FIELDS, RolloutIn
from pool.seams import INSERT_CTE_NAMES, INSERT_PARAM_NAMES, RecordPart, RecordSql, record_sql_check
from pool.verification import Verification, has_variance
from swarms.models import sample_sequence_name

#: A rejected group is kept for the contributor's inbox and the audit, not for training: its question,
#: answer and first REJECTED_KEEP_COMPLETIONS completions are stored cut to REJECTED_KEEP_CHARS
#: characters (so a stream of junk costs little storage), its claimed rewards in full.
REJECTED_KEEP_CHARS = 256
REJECTED_KEEP_COMPLETIONS = 4


# One statement per batch of shares (a share alone is a batch of one; rollout_share_batch), all of one
# swarm and catalogue version (pool.turns batches by them): arrays in, one row per group with its node, ON CONFLICT for concurrent replays, and a sample number drawn only
# for rows that become sampleable, from the swarm's own sequence; then each node's verdict counts and stored bytes, a row per node
# (a node appears once in a batch), upserted in node order so that concurrent batches lock those rows
# in one order. Parameters are bound server-side (psycopg's default) rather than quoted into the SQL
# text as Django's cursor does: quoting the completions was most of the ORM bulk_create's cost
# (docs/benchmarks.md, "Pool"). The arrays go in binary (`placeholders(binary=...)`): text format
# escapes every element with a regular expression. The parts, after the INSERT:
# - texts: the inserted groups' texts (pool_rollouttext, partitioned by day), the first of a repeated
#   id being the one inserted;
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
_P = placeholders(
    "now",
    "hour",
    "swarm",
    "catalogue_version",
    "sequence",
    binary=INSERT_PARAM_NAMES - {"now", "hour", "swarm", "catalogue_version", "sequence"},
)
# The parts a CTE takes: the parameters, and the contributor's bytes this hour (pool.budgets).
_F = {**_P, "owner_bytes": owner_hour_bytes_sql(sql.Identifier("w", "owner"))}
_INSERT_CTES: dict[str, sql.Composable] = {
    "inserted": sql.SQL("""
INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, proof_weights, audit_state, audit_reason, created_at)
SELECT u.id, u.node, {swarm}, {catalogue_version}, u.round, u.dataset, u.seed, u.index,
       u.completion_count, u.claimed::jsonb, u.verified::jsonb, u.verdict, u.reason,
       CASE WHEN u.held THEN 'held' ELSE 'ok' END, u.has_variance, u.sampleable,
       CASE WHEN u.sampleable THEN nextval({sequence}::regclass) END, u.weights, u.audit, u.audit_reason, {now}
FROM unnest({id}::uuid[], {node}::bigint[], {round}::int[], {dataset}::text[], {seed}::bigint[],
            {index}::bigint[], {count}::int[], {claimed}::text[], {verified}::text[], {verdict}::text[],
            {reason}::text[], {has_variance}::bool[], {sampleable}::bool[], {held}::bool[],
            {proof_weights}::text[], {proof_audit}::text[], {proof_audit_reason}::text[])
     AS u(id, node, round, dataset, seed, index, completion_count, claimed,
          verified, verdict, reason, has_variance, sampleable, held, weights, audit, audit_reason)
ON CONFLICT (id) DO NOTHING
RETURNING id, node_id, verdict
""").format(**_F),
    # The texts are pool_rollouttext's (partitioned by day; pool.retention ages them out), written for
    # the ids really inserted; a repeated id's first occurrence is the one the ledger took.
    "texts": sql.SQL("""
INSERT INTO pool_rollouttext (rollout_id, swarm_id, created_at, question, answer, completions, proof)
SELECT DISTINCT ON (u.id) u.id, {swarm}, {now}, u.question, u.answer, u.completions::jsonb, u.proof::jsonb
FROM unnest({id}::uuid[], {question}::text[], {answer}::text[], {completions}::text[], {proof}::text[])
     WITH ORDINALITY AS u(id, question, answer, completions, proof, n)
JOIN inserted i ON i.id = u.id ORDER BY u.id, u.n
""").format(**_F),
    "counts": sql.SQL("""
    SELECT node_id AS node, count(*) AS n,
           count(*) FILTER (WHERE verdict = 'accepted') AS a,
           count(*) FILTER (WHERE verdict <> 'accepted') AS r
    FROM inserted GROUP BY node_id
""").format(**_F),
    "conflicts": sql.SQL("""
    SELECT u.node, count(*) AS c
    FROM unnest({id}::uuid[], {node}::bigint[]) AS u(id, node)
    JOIN pool_rollout p ON p.id = u.id AND p.node_id <> u.node
    WHERE (SELECT coalesce(sum(n), 0) FROM counts) < cardinality({id}::uuid[])
    GROUP BY u.node
""").format(**_F),
    "verdict_counts": sql.SQL("""
    INSERT INTO pool_nodeverdictcounts AS t (node_id, accepted_groups, rejected_groups, updated_at)
    SELECT w.node, coalesce(c.a, 0), coalesce(c.r, 0) + coalesce(x.c, 0), now()
    FROM unnest({nodes}::bigint[]) AS w(node)
    LEFT JOIN counts c ON c.node = w.node
    LEFT JOIN conflicts x ON x.node = w.node
    WHERE c.node IS NOT NULL OR x.node IS NOT NULL
    ORDER BY w.node
    ON CONFLICT (node_id) DO UPDATE SET
        accepted_groups = t.accepted_groups + EXCLUDED.accepted_groups,
        rejected_groups = t.rejected_groups + EXCLUDED.rejected_groups,
        updated_at = now()
""").format(**_F),
    "storage": sql.SQL("""
    INSERT INTO pool_nodestoragehour AS s (node_id, hour, bytes)
    SELECT c.node, {hour}, CASE WHEN c.n = w.sent THEN w.total_bytes ELSE (
        SELECT sum(b.bytes) FROM inserted i JOIN unnest({id}::uuid[], {bytes}::bigint[]) AS b(id, bytes)
        ON b.id = i.id WHERE i.node_id = c.node
    ) END
    FROM counts c JOIN unnest({nodes}::bigint[], {sent}::int[], {total_bytes}::bigint[])
         AS w(node, sent, total_bytes) ON w.node = c.node
    ORDER BY c.node
    ON CONFLICT (node_id, hour) DO UPDATE SET bytes = s.bytes + EXCLUDED.bytes
    RETURNING node_id, bytes
""").format(**_F),
    # One owner sum per node, not one per inserted row.
    "totals": sql.SQL("""
    SELECT st.node_id, st.bytes, st.bytes + ({owner_bytes} AND o.node_id <> st.node_id
    ) AS owner_bytes
    FROM storage st JOIN unnest({nodes}::bigint[], {owners}::bigint[]) AS w(node, owner) ON w.node = st.node_id
""").format(**_F),
}
_INSERT_MATERIALIZED = ("counts", "conflicts", "totals")
_INSERT_ANSWER = sql.SQL(
    "SELECT i.id, i.node_id, t.bytes, t.owner_bytes FROM inserted i JOIN totals t ON t.node_id = i.node_id"
)

assert set(_INSERT_CTES) == INSERT_CTE_NAMES, "pool.seams declares these CTEs"
assert set().union(*map(placeholder_names, _INSERT_CTES.values())) == INSERT_PARAM_NAMES, "and these parameters"
# A parameter for each field of a group (sapo_node.protocol.WireGroup), named as the protocol names it;
# its rewards go in as claimed and as verified.
assert set(GROUP_FIELDS) - {"rewards"} <= INSERT_PARAM_NAMES, "the INSERT writes every field of a group"


def _insert_composed(record: RecordSql | None) -> sql.Composed:
    """The INSERT statement: the pool's CTEs, then the record's (they may read `inserted`), then the answer."""
    ctes = cte_list(_INSERT_CTES, materialized=_INSERT_MATERIALIZED)
    if record is not None:
        ctes = sql.SQL(",\n").join([ctes, cte_list(record.ctes)])
    return sql.SQL("WITH {ctes}\n{answer}\n").format(ctes=ctes, answer=_INSERT_ANSWER)


#: The INSERT statement's text, by moderation's RecordSql (None: no record), composed and rendered at
#: its first use: one text per moderation, so each is prepared once per connection, and psycopg's
#: text caches work as for a literal (common.composed).
_insert_sql: dict[RecordSql | None, str] = {}


def insert_statement(record: RecordPart | None) -> str:
    key = record.sql if record is not None else None
    text = _insert_sql.get(key)
    if text is None:
        if key is not None:
            record_sql_check(key)  # registered ones were checked at start-up; any other here
        text = _insert_sql[key] = rendered(_insert_composed(key))
    return text


_UNAUDITED = (AuditState.UNAUDITED.value, "")
#: (audit_state, audit_reason) of an accepted group of a node held after a failed audit: never sampleable.
NODE_HELD = (AuditState.UNAUDITED.value, AuditReason.NODE_HELD.value)
#: The proof as the texts' jsonb column gets it: msgspec writes a Struct's JSON in C, in its field order.
_PROOF_ENCODER = msgspec.json.Encoder()


def kept_text(text: str | None) -> str | None:
    """A rejected group's text as stored: cut to REJECTED_KEEP_CHARS, with a mark where it was cut."""
    if text is None or len(text) <= REJECTED_KEEP_CHARS:
        return text
    return text[:REJECTED_KEEP_CHARS] + f"… [cut: {len(text)} characters]"


@dataclass(frozen=True)
class ScreenedShare:
    """One share of a batch, verified and screened, ready for the INSERT."""

    node: Any
    rollouts: Sequence[RolloutIn]
    checks: dict[uuid.UUID, Verification]
    held: set[uuid.UUID]
    #: (audit_state, audit_reason) of the groups whose proof was checked (pool.challenges); any other
    #: group is stored unaudited with no reason.
    audits: dict[uuid.UUID, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class SwarmOfBatch:
    """The swarm a batch is stored in, and the catalogue version its groups were verified under."""

    swarm_id: int
    catalogue_version: int


def insert_batch(
    shares: Sequence[ScreenedShare], swarm: SwarmOfBatch, record: RecordPart | None = None
) -> tuple[set[uuid.UUID], dict[int, StoredBytes]]:
    """Insert the groups of several nodes' shares (one share per node), count their verdicts
    (NodeVerdictCounts, an id another node stored counting as a rejection) and the bytes stored this
    hour (NodeStorageHour), and write what moderation records of them (`record`), in one statement:
    one transaction by itself, or part of the caller's. Return the ids actually inserted (an id
    already stored is left alone, and neither counted nor charged again) and, per node that stored
    something, its bytes stored this hour after it. The `held` ids go in with moderation status "held"
    and not sampleable, and so do the groups whose audit state is NODE_HELD: no moment exists where a
    sample could see them."""
    rollouts = [r for share in shares for r in share.rollouts]
    verdicts = [share.checks[r.id] for share in shares for r in share.rollouts]
    variance = [c.accepted and has_variance(c.verified_rewards) for c in verdicts]
    holds = [r.id in share.held for share in shares for r in share.rollouts]
    audits = [share.audits.get(r.id, _UNAUDITED) for share in shares for r in share.rollouts]
    questions, answers, completions, proofs = [], [], [], []
    for r, c in zip(rollouts, verdicts, strict=True):
        if c.accepted:
            questions.append(r.question)
            answers.append(r.answer)
            completions.append(dumps_texts(r.completions))
            # Kept whole with the texts, for the audits' replay.
            proofs.append(None if r.proof is None else _PROOF_ENCODER.encode(r.proof).decode())
        else:
            # A rejected group earns nothing whatever its proof: the proof is not kept.
            questions.append(kept_text(r.question))
            answers.append(kept_text(r.answer))
            completions.append(dumps([kept_text(t) for t in r.completions[:REJECTED_KEEP_COMPLETIONS]]))
            proofs.append(None)
    claimed = [dumps_floats(r.rewards) for r in rollouts]
    verified = [None if c.verified_rewards is None else dumps_floats(c.verified_rewards) for c in verdicts]
    sizes = [
        ROW_OVERHEAD_BYTES + sum(map(utf8_len, texts))
        for texts in zip(questions, answers, completions, claimed, verified, strict=True)
    ]
    for i, proof in enumerate(proofs):
        if proof is not None:
            sizes[i] += utf8_len(proof)
    totals, start = [], 0
    for share in shares:
        totals.append(sum(sizes[start : start + len(share.rollouts)]))
        start += len(share.rollouts)
    now = timezone.now()
    hour = hour_of(now)
    params = {
        "now": now,
        "hour": hour,
        "swarm": swarm.swarm_id,
        "catalogue_version": swarm.catalogue_version,
        "sequence": sample_sequence_name(swarm.swarm_id),
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
        "sampleable": binary_array(
            "bool", [v and not h and a != NODE_HELD for v, h, a in zip(variance, holds, audits, strict=True)]
        ),
        "held": binary_array("bool", holds),
        "proof": binary_array("text", proofs),
        "proof_weights": binary_array("text", [None if r.proof is None else r.proof.weights for r in rollouts]),
        "proof_audit": binary_array("text", [state for state, _ in audits]),
        "proof_audit_reason": binary_array("text", [reason for _, reason in audits]),
    }
    if record is not None:
        params.update(record.params)  # names apart from the pool's: pool.seams.record_sql_check
    # Django's errors, as its own cursors raise them (IntegrityError for a node deleted meanwhile: the
    # batch's retry catches DatabaseError).
    with connection.wrap_database_errors, server_binding_cursor() as cursor:
        cursor.execute(insert_statement(record), params, prepare=prepare_hot())
        rows = cursor.fetchall()
    stored = {int(node): StoredBytes(hour=hour, node=int(b), owner=int(o)) for _, node, b, o in rows}
    return {row[0] for row in rows}, stored
