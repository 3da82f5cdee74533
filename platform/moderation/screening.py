"""The automatic rules at ingest: what the pool calls while storing a node's shared groups.

Two steps around the pool's INSERT; the second runs inside the pool's transaction, so no sample can
see a group before its hold is set:

1. `rollouts_screen(node_id, rollouts, checks)` after verification, before the INSERT: runs the
   enabled rules on the accepted groups. Bounded work per group: one candidate query for the whole
   batch (at most `max_candidates` other groups per question), a hash lookup per completion for
   copies, linear scans for length/characters and the blocklist.
2. `rollouts_record(node_id, screening, inserted)` right after the INSERT, before commit: holds what a
   hold rule caught, writes fingerprints, flags, decisions and audit entries (every automatic
   verdict, flag and hold), counts the verdicts into trust, and now and then re-scans the touched
   datasets for outlier nodes.
"""

from __future__ import annotations

import math
import statistics
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import connection
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from moderation import filters
from moderation.models import (
    AuditAction,
    AuditEntry,
    ModerationDecision,
    ModerationFlag,
    RolloutFingerprint,
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


def _copy_index(node_id: int, question_hashes: set[str], rules: dict[str, Rule], now: datetime) -> filters.CopyIndex:
    index = filters.CopyIndex()
    active = [r for r in (rules["duplicate_exact"], rules["duplicate_near"]) if r.enabled]
    if not active or not question_hashes:
        return index
    cutoff = now - timedelta(hours=max(r["window_hours"] for r in active))
    per_question = max(r["max_candidates"] for r in active)
    candidates = (
        RolloutFingerprint.objects.filter(question_hash__in=question_hashes, created_at__gte=cutoff)
        .exclude(node_id=node_id)
        .annotate(rank=Window(RowNumber(), partition_by=[F("question_hash")], order_by=F("created_at").desc()))
        .filter(rank__lte=per_question)
        .values_list("rollout_id", "exact", "simhash")
    )
    for rollout_id, exact, hashes in candidates:
        index.add(str(rollout_id), exact, hashes)
    return index


def rollouts_screen(
    *,
    node_id: int,
    rollouts: Sequence[RolloutIn],
    checks: Mapping[uuid.UUID, Verification],
    now: datetime | None = None,
) -> Screening:
    """Run the enabled automatic rules on a node's freshly verified groups (before they are stored).

    Only accepted groups are screened (rejected ones are never sampleable). At most one query: the
    other nodes' recent fingerprints for the same questions. The pool stores the groups, then calls
    `rollouts_record` with this result in the same transaction.
    """
    now = now or timezone.now()
    rules = rules_current()
    screening = Screening(rollouts=rollouts, checks=checks)
    accepted = [r for r in rollouts if checks[r.id].accepted]
    if not accepted:
        return screening
    for r in accepted:
        screening.fingerprints[r.id] = (filters.question_hash(r.question), filters.fingerprint(r.completions))
    index = _copy_index(node_id, {qh for qh, _ in screening.fingerprints.values()}, rules, now)
    low_trust = rules["low_trust"]
    trust = trust_for_node(node_id) if low_trust.enabled else 1.0

    for r in accepted:
        found: list[tuple[Rule, str, dict]] = []
        _, fp = screening.fingerprints[r.id]
        for key, near in (("duplicate_exact", False), ("duplicate_near", True)):
            rule = rules[key]
            if rule.enabled:
                hit = filters.copy_finding(fp, index, rule, near=near)
                if hit is not None:
                    found.append((rule, hit[0], {"sources": hit[1][:10]}))
                    break  # an exact copy is also a near one: report it once
        if rules["length"].enabled:
            detail = filters.length_finding(r.completions, rules["length"])
            if detail:
                found.append((rules["length"], detail, {}))
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
    hold what a hold rule caught (pool.services.rollout_set_moderation, before commit, so no sample sees
    it), store fingerprints, flags, decisions and audit entries (automatic verdicts included), count the
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
        from pool.services import rollout_set_moderation  # here: pool.services imports this module

        rollout_set_moderation(rollouts=list(held), status=ModerationStatus.HELD)
        ModerationDecision.objects.bulk_create(
            [
                ModerationDecision(
                    rollout_id=rid, status=ModerationStatus.HELD, reason=f.detail, rule=f.rule, decided_at=now
                )
                for rid, f in held.items()
            ],
            ignore_conflicts=True,
        )
    RolloutFingerprint.objects.bulk_create(
        [
            RolloutFingerprint(
                rollout_id=rid, node_id=node_id, question_hash=qh, exact=fp.exact, simhash=fp.simhash, created_at=now
            )
            for rid, (qh, fp) in screening.fingerprints.items()
            if rid in inserted
        ],
        ignore_conflicts=True,
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
