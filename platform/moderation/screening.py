"""The automatic rules at ingest: what the pool calls while storing a node's shared groups.

Two steps around the pool's INSERT; the second runs inside the pool's transaction, so no sample can
see a group before its hold is set:

1. `rollouts_screen(node_id, rollouts, checks)` after verification, before the INSERT: runs the
   enabled rules on the accepted groups. Bounded work per group: one candidate query for the whole
   batch (at most `max_candidates` other groups per question), a hash lookup per completion for
   copies, linear scans for length/characters and the blocklist.
   The pool reads `Screening.held` and stores those groups held (never sampleable) in its INSERT.
2. `rollouts_record(node_id, screening, inserted)` right after the INSERT, before commit: records the
   holds' decisions, writes fingerprints, flags, decisions and audit entries (every automatic
   verdict, flag and hold), counts the verdicts into trust, and now and then re-scans the touched
   datasets for outlier nodes.
"""

from __future__ import annotations

import json
import math
import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from django.core.cache import cache
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from common.compact_json import dumps
from moderation import filters
from moderation.models import (
    AuditAction,
    AuditEntry,
    ModerationDecision,
    ModerationFlag,
    TargetType,
)
from moderation.rules import Rule, rules_current
from moderation.trust import trust_for_node, trust_record_verdicts
from pool.messages import RolloutIn
from pool.models import ModerationStatus
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

    rollouts: Sequence[RolloutIn]
    checks: Mapping[uuid.UUID, Verification]
    findings: list[Finding] = field(default_factory=list)
    fingerprints: dict[uuid.UUID, tuple[str, filters.Fingerprint]] = field(default_factory=dict)

    @property
    def held(self) -> set[uuid.UUID]:
        """Ids a "hold" rule caught: they must not become sampleable."""
        return {f.rollout_id for f in self.findings if f.hold}


# The latest `per` fingerprints of other nodes' groups on each question, inside the window: one index
# descent per question (LATERAL ... LIMIT), so the work is bounded per question however popular it is.
# Parameters bound server-side (as the pool's INSERT).
_CANDIDATES_SQL = """
SELECT f.rollout_id, f.exact::text, f.simhash::text
FROM unnest(%(questions)b::text[]) AS q(hash)
CROSS JOIN LATERAL (
    SELECT rollout_id, exact, simhash FROM moderation_rolloutfingerprint
    WHERE question_hash = q.hash AND created_at >= %(cutoff)s AND node_id <> %(node)s
    ORDER BY created_at DESC
    LIMIT %(per)s
) AS f
"""


def _copy_index(node_id: int, question_hashes: set[str], rules: dict[str, Rule], now: datetime) -> filters.CopyIndex:
    """Other nodes' recent fingerprints for these questions, indexed: one query for the whole share."""
    index = filters.CopyIndex()
    active = [r for r in (rules["duplicate_exact"], rules["duplicate_near"]) if r.enabled]
    if not active or not question_hashes:
        return index
    params = {
        "questions": sorted(question_hashes),
        "cutoff": now - timedelta(hours=max(r["window_hours"] for r in active)),
        "node": node_id,
        "per": max(r["max_candidates"] for r in active),
    }
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(_CANDIDATES_SQL, params)
        for rollout_id, exact, hashes in cursor.fetchall():
            index.add(str(rollout_id), json.loads(exact), json.loads(hashes))
    return index


def _fingerprints_insert(
    *, node_id: int, fingerprints: dict[uuid.UUID, tuple[str, filters.Fingerprint]], now: datetime
) -> None:
    """Store the groups' fingerprints (RolloutFingerprint) in one statement, parameters bound server-side
    and the arrays in binary, as the pool's INSERT does: the ORM's bulk_create quoted each JSON list into
    the SQL text, which cost more than the fingerprints themselves (docs/benchmarks.md, "Pool")."""
    if not fingerprints:
        return
    connection.ensure_connection()
    with psycopg.Cursor(connection.connection) as cursor:
        cursor.execute(
            """
            INSERT INTO moderation_rolloutfingerprint (rollout_id, node_id, question_hash, exact, simhash, created_at)
            SELECT u.id, %(node)s, u.qh, u.exact::jsonb, u.simhash::jsonb, %(now)s
            FROM unnest(%(id)b::uuid[], %(qh)b::text[], %(exact)b::text[], %(simhash)b::text[])
                 AS u(id, qh, exact, simhash)
            ON CONFLICT (rollout_id) DO NOTHING
            """,
            {
                "node": node_id,
                "now": now,
                "id": list(fingerprints),
                "qh": [qh for qh, _ in fingerprints.values()],
                "exact": [dumps(fp.exact) for _, fp in fingerprints.values()],
                "simhash": [dumps(fp.simhash) for _, fp in fingerprints.values()],
            },
        )


def rollouts_screen(
    *,
    node_id: int,
    rollouts: Sequence[RolloutIn],
    checks: Mapping[uuid.UUID, Verification],
    now: datetime | None = None,
) -> Screening:
    """Run the enabled automatic rules on a node's freshly verified groups (before they are stored).

    Only accepted groups are screened (rejected ones are never sampleable). At most one query: the
    other nodes' recent fingerprints for the same questions. Each completion is normalised and
    fingerprinted once, and the character counts of the length rule taken, for the whole share in one
    numpy pass each; every rule reuses the result. The pool stores the groups, then calls
    `rollouts_record` with this result in the same transaction.
    """
    now = now or timezone.now()
    rules = rules_current()
    screening = Screening(rollouts=rollouts, checks=checks)
    accepted = [r for r in rollouts if checks[r.id].accepted]
    if not accepted:
        return screening
    for r, fp in zip(accepted, filters.fingerprints([r.completions for r in accepted]), strict=True):
        screening.fingerprints[r.id] = (filters.question_hash(r.question), fp)
    index = _copy_index(node_id, {qh for qh, _ in screening.fingerprints.values()}, rules, now)
    low_trust = rules["low_trust"]
    trust = trust_for_node(node_id) if low_trust.enabled else 1.0

    length = rules["length"]
    length_hits = filters.length_findings([r.completions for r in accepted], length) if length.enabled else []
    fps = [screening.fingerprints[r.id][1] for r in accepted]
    copies = {
        key: filters.copy_findings(fps, index, rules[key], near=near)
        for key, near in (("duplicate_exact", False), ("duplicate_near", True))
        if rules[key].enabled
    }

    for n, r in enumerate(accepted):
        found: list[tuple[Rule, str, dict]] = []
        for key, hits in copies.items():
            if hits[n] is not None:
                found.append((rules[key], hits[n][0], {"sources": hits[n][1][:10]}))
                break  # an exact copy is also a near one: report it once
        if length.enabled and length_hits[n]:
            found.append((length, length_hits[n], {}))
        if rules["blocklist"].enabled and rules["blocklist"]["patterns"]:
            detail = filters.blocklist_finding([r.question, r.answer or "", *r.completions], rules["blocklist"])
            if detail:
                found.append((rules["blocklist"], detail, {}))
        if low_trust.enabled and trust < low_trust["threshold"]:
            found.append((low_trust, f"node trust {trust:.2f} is below {low_trust['threshold']:.2f}", {}))
        screening.findings += [Finding(r.id, rule.key, detail, rule.holds, data) for rule, detail, data in found]
    return screening


def rollouts_record(
    *, node_id: int, screening: Screening, inserted: set[uuid.UUID], now: datetime | None = None
) -> None:
    """After the pool inserted the groups (`inserted`: the ids really inserted now), in its transaction:
    record the decisions for what a hold rule caught (the pool stored those held already, from
    `screening.held`, so no sample ever sees them), store fingerprints, flags, decisions and audit entries (automatic verdicts included), count the
    verdicts into trust, and now and then re-scan the touched datasets for outlier nodes."""
    now = now or timezone.now()
    rollouts = [r for r in screening.rollouts if r.id in inserted]
    if not rollouts:
        return
    checks = screening.checks
    findings = [f for f in screening.findings if f.rollout_id in inserted]
    held: dict[uuid.UUID, Finding] = {}
    for f in findings:
        if f.hold:
            held.setdefault(f.rollout_id, f)
    if held:
        # The pool stored these held already (it read `screening.held` before its INSERT): record why.
        ModerationDecision.objects.bulk_create(
            [
                ModerationDecision(
                    rollout_id=rid, status=ModerationStatus.HELD, reason=f.detail, rule=f.rule, decided_at=now
                )
                for rid, f in held.items()
            ],
            ignore_conflicts=True,
        )
    _fingerprints_insert(
        node_id=node_id,
        fingerprints={rid: v for rid, v in screening.fingerprints.items() if rid in inserted},
        now=now,
    )
    ModerationFlag.objects.bulk_create(
        [
            ModerationFlag(rollout_id=f.rollout_id, node_id=node_id, rule=f.rule, detail=f.detail, data=f.data)
            for f in findings
        ]
    )
    entries = [
        AuditEntry(
            created_at=now,
            rule="verification",
            action=AuditAction.AUTO_VERDICT,
            target_type=TargetType.ROLLOUT,
            target_id=str(r.id),
            reason=checks[r.id].reason,
            details={"node": node_id, "dataset": r.dataset},
        )
        for r in rollouts
        if not checks[r.id].accepted
    ]
    entries += [
        AuditEntry(
            created_at=now,
            rule=f.rule,
            action=AuditAction.AUTO_HOLD if f.hold else AuditAction.AUTO_FLAG,
            target_type=TargetType.ROLLOUT,
            target_id=str(f.rollout_id),
            reason=f.detail,
            details={"node": node_id, **f.data},
        )
        for f in findings
    ]
    AuditEntry.objects.bulk_create(entries)
    trust_record_verdicts(node_id=node_id, verdicts=[checks[r.id].accepted for r in rollouts], now=now)
    rule = rules_current()["outlier"]
    if rule.enabled:
        for dataset in sorted({r.dataset for r in rollouts if checks[r.id].accepted}):
            if cache.add(f"moderation:outlier-scan:{dataset}", 1, rule["scan_every_seconds"]):
                outlier_scan(dataset=dataset, rule=rule, now=now)


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
