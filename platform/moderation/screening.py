"""The automatic rules at ingest: what the pool calls while storing nodes' shared groups.

Three steps around the pool's INSERT, each for a batch of shares of different nodes (one share is a
batch of one; pool.ingest.rollout_share_batch); the second is part of the INSERT's own statement,
so no sample can see a group before its hold is set, and nothing is recorded of a group not stored:

1. `rollouts_screen(shares)` after verification, before the INSERT: runs the enabled rules on the
   accepted groups. Bounded work per group: one candidate query for the whole batch (at most
   `max_candidates` other groups per question), a hash lookup per completion for copies, linear
   scans for length/characters and the blocklist. The pool reads each `Screening.held` and stores
   those groups held (never sampleable) in its INSERT.
2. `rollouts_record_part(screenings)`: what to write, as CTEs of the INSERT's statement
   (pool.seams.RecordPart): the holds' decisions, fingerprints, flags, audit entries (every automatic
   verdict, flag and hold), and the verdicts counted into each node's trust, of the groups the
   statement really inserts (a resent id is left out in SQL).
3. `rollouts_recorded(screenings, inserted)` after the statement: now and then re-scans the touched
   datasets for outlier nodes.
"""

from __future__ import annotations

import math
import statistics
import struct
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import connection
from django.db.models import Q
from django.utils import timezone
from psycopg import sql

from common.compact_json import dumps
from common.composed import placeholders, rendered
from common.db import binary_array, prepare_hot, server_binding_cursor
from moderation import filters
from moderation.models import (
    AuditAction,
    AuditEntry,
    ModerationFlag,
    TargetType,
)
from moderation.rules import Rule, rules_current, swarm_rules_current
from moderation.trust import (
    TRUST_PARAM_NAMES,
    TRUST_VERDICTS_CTES,
    trust_judged_params,
    trust_value,
)
from pool.models import ModerationStatus
from pool.records import RolloutIn
from pool.seams import RECORD_READS_PARAMS, RecordPart, RecordSql, ShareToScreen
from pool.verification import Verification


@dataclass
class Finding:
    rollout_id: uuid.UUID
    rule: str
    detail: str
    hold: bool
    data: dict = field(default_factory=dict)


@dataclass
class Screening:
    """What the rules found in one share: per-group findings and the accepted groups' fingerprints."""

    node_id: int
    rollouts: Sequence[RolloutIn]
    checks: Mapping[uuid.UUID, Verification]
    swarm_id: int
    findings: list[Finding] = field(default_factory=list)
    fingerprints: dict[uuid.UUID, tuple[str, filters.Fingerprint]] = field(default_factory=dict)

    @property
    def held(self) -> set[uuid.UUID]:
        """Ids a "hold" rule caught: they must not become sampleable."""
        return {f.rollout_id for f in self.findings if f.hold}


# The latest `per` fingerprints of other nodes' groups on each question, inside the window: one index
# descent per question (LATERAL ... LIMIT), so the work is bounded per question however popular it is;
# and each node's trust streak (the low-trust rule), in the same round trip: a row per node of the
# batch of shares (pool.ingest.rollout_share_batch; one node appears once). Parameters bound
# server-side (as the pool's INSERT), the result in binary. The candidates come back as five byte
# strings (their ids as 16-byte UUIDs, their completion counts as 4-byte integers, their digests, their
# simhashes, their questions' 20-byte keys; filters.CopyIndex), in the order the rules read them (question, then latest
# first): at 50 groups per question, ~13,000 completions, a JSON document would cost the server more
# to decode and index than the rest of the share, and PostgreSQL more to build.
_SCREENING_READS_SQL = rendered(
    sql.SQL("""
SELECT n.node, c.ids, c.counts, c.exact, c.simhash, c.questions,
       (SELECT streak FROM moderation_trustrecord WHERE node_id = n.node)
FROM unnest({nodes}::bigint[]) AS n(node)
LEFT JOIN (
    SELECT q.node,
           string_agg(uuid_send(f.rollout_id), ''::bytea {order}) AS ids,
           string_agg(int4send(octet_length(f.simhash) / 8), ''::bytea {order}) AS counts,
           string_agg(f.exact, ''::bytea {order}) AS exact,
           string_agg(f.simhash, ''::bytea {order}) AS simhash,
           string_agg(decode(q.hash, 'hex'), ''::bytea {order}) AS questions
    FROM unnest({questions}::text[], {question_nodes}::bigint[]) WITH ORDINALITY AS q(hash, node, n)
    CROSS JOIN LATERAL (
        SELECT rollout_id, exact, simhash, created_at FROM moderation_rolloutfingerprint
        WHERE question_hash = q.hash AND created_at >= {cutoff} AND node_id <> q.node
        ORDER BY created_at DESC
        LIMIT {per}
    ) AS f
    GROUP BY q.node
) AS c ON c.node = n.node
""").format(
        order=sql.SQL("ORDER BY q.n, f.created_at DESC"),
        **placeholders("cutoff", "per", binary=("nodes", "questions", "question_nodes")),
    )
)


def _screening_reads(
    questions: Mapping[int, set[str]], rules: dict[str, Rule], now: datetime, *, trust_wanted: bool = False
) -> dict[int, tuple[filters.CopyIndex, float]]:
    """Per node (node id -> the question hashes of its accepted groups): other nodes' recent
    fingerprints for those questions, indexed, and the node's trust (1.0 when no low-trust rule, the
    site's or, `trust_wanted`, a swarm's, is on). One query for the whole batch, none when neither is
    wanted."""
    active = [r for r in (rules["duplicate_exact"], rules["duplicate_near"]) if r.enabled]
    want_trust = rules["low_trust"].enabled or trust_wanted
    if not want_trust and (not active or not any(questions.values())):
        return {node: (filters.CopyIndex(questions=b""), 1.0) for node in questions}
    hashes, owners = [], []
    if active:
        for node, node_questions in questions.items():
            ordered = sorted(node_questions)
            hashes += ordered
            owners += [node] * len(ordered)
    params = {
        "nodes": binary_array("int8", list(questions)),
        "questions": binary_array("text", hashes),
        "question_nodes": binary_array("int8", owners),
        "cutoff": now - timedelta(hours=max((r["window_hours"] for r in active), default=0)),
        "per": max((r["max_candidates"] for r in active), default=0),
    }
    with server_binding_cursor() as cursor:
        cursor.execute(_SCREENING_READS_SQL, params, prepare=prepare_hot(), binary=True)
        rows = cursor.fetchall()
    found = {}
    for node, ids, counts, exact, simhashes, keys, streak in rows:
        index = (
            filters.CopyIndex(ids, struct.unpack(f">{len(counts) // 4}i", counts), exact, simhashes, keys)
            if ids
            else filters.CopyIndex(questions=b"")
        )
        found[node] = (index, trust_value(streak or 0, rules["trust"]["half_streak"]) if want_trust else 1.0)
    return found


# Everything moderation writes about a batch, as common table expressions of the pool's INSERT
# statement (pool.seams.RecordSql, declared as RECORD_SQL below; arrays bound server-side and in
# binary, as the pool's): the decisions for holds, the fingerprints, the flags, the audit entries and
# the trust upsert, for every share of the batch (a node per row), each about the groups the
# statement really inserted (its CTE `inserted`) and no other. No statement, BEGIN or COMMIT of its own: three round trips fewer a batch
# (docs/benchmarks.md, "How ingest is made fast").
_P = placeholders(
    "now",
    "held_status",
    "audit_target",
    binary=(
        "held_id",
        "held_reason",
        "held_rule",
        "fp_id",
        "fp_node",
        "fp_qh",
        "fp_exact",
        "fp_simhash",
        "flag_id",
        "flag_node",
        "flag_rule",
        "flag_detail",
        "flag_data",
        "audit_rule",
        "audit_action",
        "audit_id",
        "audit_reason",
        "audit_details",
    ),
)
_RECORD_CTES: dict[str, sql.Composable] = {
    "decisions": sql.SQL("""
    INSERT INTO moderation_moderationdecision (rollout_id, status, reason, rule, actor_id, batch, decided_at)
    SELECT u.id, {held_status}, u.reason, u.rule, NULL, gen_random_uuid(), {now}
    FROM unnest({held_id}::uuid[], {held_reason}::text[], {held_rule}::text[]) AS u(id, reason, rule)
    WHERE u.id IN (SELECT id FROM inserted)
    ON CONFLICT (rollout_id) DO NOTHING
""").format(**_P),
    "fingerprints": sql.SQL("""
    INSERT INTO moderation_rolloutfingerprint (rollout_id, node_id, question_hash, exact, simhash, created_at)
    SELECT u.id, u.node, u.qh, u.exact, u.simhash, {now}
    FROM unnest({fp_id}::uuid[], {fp_node}::bigint[], {fp_qh}::text[], {fp_exact}::bytea[],
                {fp_simhash}::bytea[]) AS u(id, node, qh, exact, simhash)
    WHERE u.id IN (SELECT id FROM inserted)
    ON CONFLICT (rollout_id) DO NOTHING
""").format(**_P),
    "flags": sql.SQL("""
    INSERT INTO moderation_moderationflag (rollout_id, node_id, rule, detail, data, created_at, resolved_at)
    SELECT u.id, u.node, u.rule, u.detail, u.data::jsonb, {now}, NULL
    FROM unnest({flag_id}::uuid[], {flag_node}::bigint[], {flag_rule}::text[], {flag_detail}::text[],
                {flag_data}::text[]) AS u(id, node, rule, detail, data)
    WHERE u.id IN (SELECT id FROM inserted)
""").format(**_P),
    "audit": sql.SQL("""
    INSERT INTO moderation_auditentry
        (created_at, actor_id, rule, action, target_type, target_id, count, reason, details)
    SELECT {now}, NULL, u.rule, u.action, {audit_target}, u.id::text, 1, u.reason, u.details::jsonb
    FROM unnest({audit_rule}::text[], {audit_action}::text[], {audit_id}::uuid[], {audit_reason}::text[],
                {audit_details}::text[]) AS u(rule, action, id, reason, details)
    WHERE u.id IN (SELECT id FROM inserted)
""").format(**_P),
    **TRUST_VERDICTS_CTES,
}
# The parameters are those named in _P (the pool's `now` aside) and trust's: RecordSql checks them
# against the placeholders the CTEs really use.
RECORD_SQL = RecordSql(ctes=_RECORD_CTES, param_names=frozenset(_P.keys() - RECORD_READS_PARAMS) | TRUST_PARAM_NAMES)


def rollouts_screen(*, shares: Sequence[ShareToScreen], now: datetime | None = None) -> list[Screening]:
    """Run the enabled automatic rules on freshly verified shares (before they are stored): a
    Screening per share, in order. The shares are of different nodes (pool.ingest.rollout_share_batch
    verifies and stores several together).

    Only accepted groups are screened (rejected ones are never sampleable). At most one query for the
    whole batch: other nodes' recent fingerprints for each node's questions, and each node's trust. Each
    completion is normalised and fingerprinted once, and the character counts of the characters rule
    taken, for all the shares in one pass each; every rule reuses the result. The pool stores the
    groups with `rollouts_record_part`'s CTEs of the result in the same statement.

    A group is compared with what other nodes stored before the batch and with the accepted groups of
    its batch-mates ahead of it (other nodes', on the same questions, the latest first, before the
    stored ones), as it would be were the shares stored one after the other: two colluding nodes
    sending one text at once are not both let through because their shares waited together. (Two
    shares in flight at once in separate batches, on two slots or two workers, do not see each other:
    neither is stored when the other reads.)"""
    now = now or timezone.now()
    rules = rules_current()
    screenings = [
        Screening(node_id=s.node_id, rollouts=s.rollouts, checks=s.checks, swarm_id=s.swarm_id) for s in shares
    ]
    # Each share's swarm's own rules, applied besides the site's (a batch is of one swarm).
    own = [swarm_rules_current(s.swarm_id) for s in shares]
    accepted = [[r for r in s.rollouts if s.checks[r.id].accepted] for s in shares]
    every = [r for share in accepted for r in share]
    if not every:
        return screenings
    fingerprints = filters.fingerprints([r.completions for r in every])
    questions = filters.question_hashes([r.question for r in every])
    texts = [r.completions for r in every]
    text_hits = {
        key: find(texts, rules[key])
        for key, find in (("length", filters.length_findings), ("characters", filters.character_findings))
        if rules[key].enabled
    }
    start = 0
    spans = []  # each share's accepted groups: [start, end) of `every`
    wanted: dict[int, set[str]] = {}  # node id -> the question hashes of its accepted groups
    for screening, share in zip(screenings, accepted, strict=True):
        end = start + len(share)
        spans.append((start, end))
        for n, r in enumerate(share, start):
            screening.fingerprints[r.id] = (questions[n], fingerprints[n])
        if share:
            wanted.setdefault(screening.node_id, set()).update(questions[start:end])
        start = end
    reads = _screening_reads(wanted, rules, now, trust_wanted=any("low_trust" in o for o in own))
    copies = rules["duplicate_exact"].enabled or rules["duplicate_near"].enabled
    for k, (screening, share, (first, end)) in enumerate(zip(screenings, accepted, spans, strict=True)):
        if not share:
            continue
        index, trust = reads[screening.node_id]
        if copies and k:
            # The batch-mates ahead, latest first: their accepted groups on this node's questions.
            mine = wanted[screening.node_id]
            ahead = [
                (rid, qh, fp)
                for mate in reversed(screenings[:k])
                if mate.node_id != screening.node_id
                for rid, (qh, fp) in reversed(mate.fingerprints.items())
                if qh in mine
            ]
            index = index.after([(rid, fp) for rid, _, fp in ahead], [qh for _, qh, _ in ahead])
        screening.findings = _findings(
            share,
            fingerprints[first:end],
            questions[first:end],
            {k: h[first:end] for k, h in text_hits.items()},
            index,
            trust,
            rules,
        )
        if own[k]:
            screening.findings += _swarm_findings(share, screening.findings, trust, own[k], screening.swarm_id)
    return screenings


def _findings(
    accepted: Sequence[RolloutIn],
    fps: Sequence[filters.Fingerprint],
    question_hashes: Sequence[str],
    text_hits: dict[str, Sequence[str | None]],
    index: filters.CopyIndex,
    trust: float,
    rules: dict[str, Rule],
) -> list[Finding]:
    """What the enabled rules find in one share's accepted groups (`question_hashes`: theirs, which the
    copy rules compare each group's completions on; `text_hits`: the length and characters rules'
    findings, by key, for the enabled ones)."""
    low_trust = rules["low_trust"]
    copies = {
        key: filters.copy_findings(fps, index, rules[key], near=near, questions=question_hashes)
        for key, near in (("duplicate_exact", False), ("duplicate_near", True))
        if rules[key].enabled
    }
    findings = []
    for n, r in enumerate(accepted):
        found: list[tuple[Rule, str, dict]] = []
        for key, hits in copies.items():
            if hits[n] is not None:
                found.append((rules[key], hits[n][0], {"sources": hits[n][1][:10]}))
                break  # an exact copy is also a near one: report it once
        for key, hits in text_hits.items():
            if hits[n]:
                found.append((rules[key], hits[n], {}))
        if rules["blocklist"].enabled and rules["blocklist"]["patterns"]:
            detail = filters.blocklist_finding([r.question, r.answer or "", *r.completions], rules["blocklist"])
            if detail:
                found.append((rules["blocklist"], detail, {}))
        if low_trust.enabled and trust < low_trust["threshold"]:
            found.append((low_trust, f"node trust {trust:.2f} is below {low_trust['threshold']:.2f}", {}))
        findings += [Finding(r.id, rule.key, detail, rule.holds, data) for rule, detail, data in found]
    return findings


def _swarm_findings(
    accepted: Sequence[RolloutIn], found: Sequence[Finding], trust: float, own: dict[str, Rule], swarm_id: int
) -> list[Finding]:
    """What a swarm's own rules (`own`, enabled ones, by key) find in one share's accepted groups,
    besides what the site's rules found (`found`): a group the site's rule of a key caught already is
    not reported again for that key."""
    caught = {(f.rollout_id, f.rule) for f in found}
    data = {"swarm": swarm_id}
    texts = [r.completions for r in accepted]
    text_hits = {
        key: (own[key], find(texts, own[key]))
        for key, find in (("length", filters.length_findings), ("characters", filters.character_findings))
        if key in own
    }
    findings = []
    for n, r in enumerate(accepted):
        hits: list[tuple[Rule, str]] = [(rule, found[n]) for rule, found in text_hits.values() if found[n]]
        blocklist = own.get("blocklist")
        if blocklist is not None and blocklist["patterns"]:
            detail = filters.blocklist_finding([r.question, r.answer or "", *r.completions], blocklist)
            if detail:
                hits.append((blocklist, detail))
        low_trust = own.get("low_trust")
        if low_trust is not None and trust < low_trust["threshold"]:
            hits.append((low_trust, f"node trust {trust:.2f} is below {low_trust['threshold']:.2f}"))
        findings += [
            Finding(r.id, rule.key, detail, rule.holds, dict(data))
            for rule, detail in hits
            if (r.id, rule.key) not in caught
        ]
    return findings


def rollouts_record_part(*, screenings: Sequence[Screening]) -> RecordPart:
    """What the rules record of a batch of screened shares, as part of the pool's INSERT statement
    (pool.seams.RecordPart), so it is written in the INSERT's own transaction: the decisions for what a
    hold rule caught (the pool stores those groups held already, from each `Screening.held`, so no
    sample ever sees them), fingerprints, flags, audit entries (automatic verdicts included), and the
    verdicts counted into each node's trust, each only for the groups the statement really inserts
    (a resent id is left out in SQL)."""
    held: dict[uuid.UUID, Finding] = {}
    fingerprints: list[tuple[int, uuid.UUID, tuple[str, filters.Fingerprint]]] = []  # (node, id, (qh, fp))
    flags: list[tuple[int, Finding]] = []
    audit: list[tuple[str, str, uuid.UUID, str, dict]] = []  # (rule, action, rollout id, reason, details)
    judged: list[tuple[uuid.UUID, int, bool]] = []  # (id, node, accepted), in the order judged
    for screening in screenings:
        node_id = screening.node_id
        checks = screening.checks
        for f in screening.findings:
            if f.hold:
                held.setdefault(f.rollout_id, f)
        fingerprints += [(node_id, rid, v) for rid, v in screening.fingerprints.items()]
        flags += [(node_id, f) for f in screening.findings]
        audit += [
            (
                "verification",
                AuditAction.AUTO_VERDICT,
                r.id,
                checks[r.id].reason,
                {"node": node_id, "dataset": r.dataset},
            )
            for r in screening.rollouts
            if not checks[r.id].accepted
        ] + [
            (
                f.rule,
                AuditAction.AUTO_HOLD if f.hold else AuditAction.AUTO_FLAG,
                f.rollout_id,
                f.detail,
                {"node": node_id, **f.data},
            )
            for f in screening.findings
        ]
        judged += [(r.id, node_id, checks[r.id].accepted) for r in screening.rollouts]
    params = {
        "held_status": ModerationStatus.HELD.value,
        "held_id": binary_array("uuid", list(held)),
        "held_reason": binary_array("text", [f.detail for f in held.values()]),
        "held_rule": binary_array("text", [f.rule for f in held.values()]),
        "fp_id": binary_array("uuid", [rid for _, rid, _ in fingerprints]),
        "fp_node": binary_array("int8", [node for node, _, _ in fingerprints]),
        "fp_qh": binary_array("text", [qh for _, _, (qh, _) in fingerprints]),
        "fp_exact": binary_array("bytea", [fp.exact_bytes() for _, _, (_, fp) in fingerprints]),
        "fp_simhash": binary_array("bytea", [fp.simhash_packed for _, _, (_, fp) in fingerprints]),
        "flag_id": binary_array("uuid", [f.rollout_id for _, f in flags]),
        "flag_node": binary_array("int8", [node for node, _ in flags]),
        "flag_rule": binary_array("text", [f.rule for _, f in flags]),
        "flag_detail": binary_array("text", [f.detail for _, f in flags]),
        "flag_data": binary_array("text", [dumps(f.data) for _, f in flags]),
        "audit_target": TargetType.ROLLOUT.value,
        "audit_rule": binary_array("text", [a[0] for a in audit]),
        "audit_action": binary_array("text", [str(a[1].value) for a in audit]),
        "audit_id": binary_array("uuid", [a[2] for a in audit]),
        "audit_reason": binary_array("text", [a[3] for a in audit]),
        "audit_details": binary_array("text", [dumps(a[4]) for a in audit]),
        **trust_judged_params(judged),
    }
    return RECORD_SQL.part(params)


def rollouts_recorded(
    *, screenings: Sequence[Screening], inserted: set[uuid.UUID], now: datetime | None = None
) -> None:
    """After the pool's statement stored a batch (`inserted`: the ids it really inserted): now and
    then, re-scan the datasets of the accepted groups for outlier nodes (at most once per
    `scan_every_seconds` per dataset and process)."""
    rule = rules_current()["outlier"]
    if not rule.enabled:
        return
    datasets = {r.dataset for s in screenings for r in s.rollouts if r.id in inserted and s.checks[r.id].accepted}
    now = now or timezone.now()
    for dataset in sorted(datasets):
        if _outlier_scan_due(dataset, rule["scan_every_seconds"]):
            outlier_scan(dataset=dataset, rule=rule, now=now)


#: dataset -> monotonic time before which this process does not ask the cache again (a scan is due at
#: most every scan_every_seconds: asking the cache on every share cost a lookup per dataset per share).
_outlier_not_before: dict[str, float] = {}


def _outlier_scan_due(dataset: str, every_seconds: int) -> bool:
    """Whether this share should re-scan the dataset: at most once per `every_seconds` across the
    processes sharing Django's cache, and at most one cache lookup per period in each process."""
    now = time.monotonic()
    if now < _outlier_not_before.get(dataset, 0.0):
        return False
    _outlier_not_before[dataset] = now + every_seconds
    return cache.add(f"moderation:outlier-scan:{dataset}", 1, every_seconds)


# --- outlier nodes --------------------------------------------------------------------------------


def _node_means(dataset: str, since: datetime, limit: int) -> list[tuple[int, int, float]]:
    """(node id, groups, mean verified reward) over the dataset's latest accepted groups."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT node_id, count(*), avg(m) FROM (
                SELECT node_id,
                       (SELECT avg(x::float8) FROM jsonb_array_elements_text(verified_rewards) AS x) AS m
                FROM pool_rollout
                WHERE dataset = %s AND verdict = 'accepted' AND created_at >= %s
                ORDER BY created_at DESC LIMIT %s
            ) AS g
            WHERE m IS NOT NULL
            GROUP BY node_id
            """,
            [dataset, since, limit],
        )
        return [(int(n), int(c), float(m)) for n, c, m in cursor.fetchall()]


def outlier_scores(means: list[tuple[int, int, float]], rule: Rule) -> dict[int, tuple[float, float, float]]:
    """node id -> (z, its mean, the others' mean) for qualifying nodes with |z| >= z_threshold.

    z = (m_node - mean(m_others)) / max(sd(m_others), sd_floor), over nodes with at least `min_groups`
    groups, judged only when at least `min_nodes` other qualifying nodes exist.
    """
    qualifying = {n: m for n, c, m in means if c >= rule["min_groups"]}
    outliers: dict[int, tuple[float, float, float]] = {}
    for node_id, mean in qualifying.items():
        others = [m for n, m in qualifying.items() if n != node_id]
        if len(others) < rule["min_nodes"]:
            continue
        centre = statistics.fmean(others)
        spread = max(statistics.pstdev(others), rule["sd_floor"])
        z = (mean - centre) / spread
        if math.isfinite(z) and abs(z) >= rule["z_threshold"]:
            outliers[node_id] = (z, mean, centre)
    return outliers


def outlier_scan(*, dataset: str, rule: Rule | None = None, now: datetime | None = None) -> list[ModerationFlag]:
    """Flag (never reject) the nodes whose mean verified reward on `dataset` is an outlier; a node with an
    open outlier flag on the dataset is not flagged again. Returns the new flags."""
    rule = rule or rules_current()["outlier"]
    now = now or timezone.now()
    outliers = outlier_scores(
        _node_means(dataset, now - timedelta(hours=rule["window_hours"]), rule["max_groups"]), rule
    )
    if not outliers:
        return []
    already = set(
        ModerationFlag.objects.filter(
            Q(rollout__isnull=True),
            rule="outlier",
            resolved_at__isnull=True,
            node_id__in=list(outliers),
            data__dataset=dataset,
        ).values_list("node_id", flat=True)
    )
    flags = []
    entries = []
    for node_id, (z, mean, centre) in sorted(outliers.items()):
        if node_id in already:
            continue
        detail = f"{dataset}: mean verified reward {mean:.3f} vs {centre:.3f} for other nodes (z = {z:+.1f})"
        data = {"dataset": dataset, "z": round(z, 3), "mean": round(mean, 4), "others": round(centre, 4)}
        flags.append(ModerationFlag(node_id=node_id, rule="outlier", detail=detail, data=data, created_at=now))
        entries.append(
            AuditEntry(
                created_at=now,
                rule="outlier",
                action=AuditAction.AUTO_FLAG,
                target_type=TargetType.NODE,
                target_id=str(node_id),
                reason=detail,
                details=data,
            )
        )
    ModerationFlag.objects.bulk_create(flags)
    AuditEntry.objects.bulk_create(entries)
    return flags
