"""Moderators' reads (queue, audit log, nodes, rules) and the contributor's rejection inbox."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, Exists, F, IntegerField, OuterRef, Prefetch, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce, TruncDate

from accounts.models import User
from moderation.models import AuditEntry, ModerationFlag, ModerationRule, TrustRecord
from moderation.rules import PER_SWARM_KEYS, RULES, Rule, default_rule, rule_of_row, rules_current
from moderation.trust import trust_value
from nodes.models import Node
from nodes.presence import with_connected
from pool.models import ModerationStatus, RejectReason, RetentionDay, Rollout, Verdict
from swarms.scope import Scope


def rollout_queue_base(*, filters: dict[str, Any]) -> QuerySet[Rollout]:
    """The groups a queue filter matches (no joins loaded: also what bulk actions and counts use).

    filters: status ("any" or a moderation status), reason ("accepted" or a verdict reason), flag ("any",
    "none" or a rule key: open flags only), swarm (slug), dataset, node (id), contributor (username), since,
    until.
    """
    queryset = Rollout.objects.all()
    status = filters.get("status")
    if status and status != "any":
        queryset = queryset.filter(moderation_status=status)
    reason = filters.get("reason")
    if reason == "accepted":
        queryset = queryset.filter(verdict=Verdict.ACCEPTED)
    elif reason:
        queryset = queryset.filter(verdict=Verdict.REJECTED, reason=reason)
    flag = filters.get("flag")
    if flag:
        open_flags = ModerationFlag.objects.filter(rollout_id=OuterRef("id"), resolved_at__isnull=True)
        if flag == "none":
            queryset = queryset.filter(~Exists(open_flags))
        elif flag == "any":
            queryset = queryset.filter(Exists(open_flags))
        else:
            queryset = queryset.filter(Exists(open_flags.filter(rule=flag)))
    if filters.get("swarm"):
        queryset = queryset.filter(swarm__slug=filters["swarm"])
    if filters.get("dataset"):
        queryset = queryset.filter(dataset=filters["dataset"])
    if filters.get("node"):
        queryset = queryset.filter(node_id=filters["node"])
    if filters.get("contributor"):
        queryset = queryset.filter(node__owner__username__iexact=filters["contributor"])
    if filters.get("since"):
        queryset = queryset.filter(created_at__gte=filters["since"])
    if filters.get("until"):
        queryset = queryset.filter(created_at__lt=filters["until"])
    return queryset


def rollout_queue(*, filters: dict[str, Any]) -> QuerySet[Rollout]:
    """The queue's rows, newest first, with author, trust, decision, texts (or when they aged out:
    `texts_dropped_at`, pool.retention) and open flags loaded (2 queries a page)."""
    return (
        rollout_queue_base(filters=filters)
        .annotate(_day=TruncDate("created_at", tzinfo=UTC))
        .annotate(
            texts_dropped_at=Subquery(
                RetentionDay.objects.filter(day=OuterRef("_day"), dropped_at__isnull=False).values("dropped_at")[:1]
            )
        )
        .select_related(
            "node", "node__owner", "node__trust_record", "moderation_decision", "moderation_decision__actor"
        )
        .with_texts()
        .prefetch_related(
            Prefetch(
                "moderation_flags",
                queryset=ModerationFlag.objects.filter(resolved_at__isnull=True).order_by("id"),
                to_attr="open_flags",
            )
        )
        .order_by("-created_at", "id")
    )


def rollout_moderation_get(*, rollout_id: Any) -> Rollout | None:
    return rollout_queue(filters={"status": "any"}).filter(id=rollout_id).first()


def node_trust(node: Node) -> float:
    """Trust of a node listed with select_related("trust_record") (no query)."""
    try:
        streak = node.trust_record.streak
    except TrustRecord.DoesNotExist:
        streak = 0
    return trust_value(streak, rules_current()["trust"]["half_streak"])


def audit_list(*, filters: dict[str, Any]) -> QuerySet[AuditEntry]:
    queryset = AuditEntry.objects.select_related("actor").order_by("-created_at", "-id")
    if filters.get("action"):
        queryset = queryset.filter(action=filters["action"])
    if filters.get("actor"):
        queryset = queryset.filter(actor__username__iexact=filters["actor"])
    if filters.get("rule"):
        queryset = queryset.filter(rule=filters["rule"])
    if filters.get("target_type"):
        queryset = queryset.filter(target_type=filters["target_type"])
    if filters.get("target_id"):
        queryset = queryset.filter(target_id=filters["target_id"])
    if filters.get("since"):
        queryset = queryset.filter(created_at__gte=filters["since"])
    if filters.get("until"):
        queryset = queryset.filter(created_at__lt=filters["until"])
    return queryset


def _count(queryset: QuerySet) -> Coalesce:
    counted = queryset.order_by().values("node_id").annotate(n=Count("id")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def node_moderation_list(*, filters: dict[str, Any]) -> QuerySet[Node]:
    """Nodes with owner, trust record, presence (for status), open outlier/node flags and group counts
    (fixed queries a page)."""
    queryset = (
        with_connected(Node.objects.select_related("owner", "trust_record"))
        .annotate(
            # Correlated subqueries: evaluated for the page's rows only, not by aggregating the whole pool.
            groups=_count(Rollout.objects.filter(node_id=OuterRef("id"))),
            held=_count(Rollout.objects.filter(node_id=OuterRef("id"), moderation_status=ModerationStatus.HELD)),
            streak=Coalesce(F("trust_record__streak"), Value(0)),
        )
        .prefetch_related(
            Prefetch(
                "moderation_flags",
                queryset=ModerationFlag.objects.filter(resolved_at__isnull=True, rollout__isnull=True),
                to_attr="open_node_flags",
            )
        )
    )
    q = filters.get("q")
    if q:
        queryset = queryset.filter(Q(name__icontains=q) | Q(owner__username__icontains=q))
    state = filters.get("state")
    if state == "flagged":
        queryset = queryset.filter(
            Exists(
                ModerationFlag.objects.filter(node_id=OuterRef("id"), rollout__isnull=True, resolved_at__isnull=True)
            )
        )
    elif state == "banned":
        queryset = queryset.filter(Q(banned_at__isnull=False) | Q(owner__banned_at__isnull=False))
    if state == "low_trust":
        return queryset.order_by("streak", "id")
    return queryset.order_by("-created_at", "-id")


def rule_swarm_id(scope: Scope) -> int | None:
    """The `ModerationRule.swarm_id` of the rules of `scope`: NULL for the site's, which apply to every
    swarm, else the swarm's id."""
    return None if Scope.check(scope).is_site else scope.swarm_id


def rule_list(*, scope: Scope) -> list[dict[str, Any]]:
    """The site's rules (`Scope.site()`), each with its spec, current settings and last change; or one
    swarm's own (`Scope.swarm(id)`: the keys a swarm may have), its settings where it has a row, else
    the rule's defaults switched off (not applied)."""
    rows = {r.key: r for r in ModerationRule.objects.filter(swarm_id=rule_swarm_id(scope)).select_related("updated_by")}
    if scope.is_site:
        current = rules_current(use_cache=False)
        return [{"spec": spec, "rule": current[key], "row": rows.get(key)} for key, spec in RULES.items()]
    items = []
    for key in PER_SWARM_KEYS:
        row = rows.get(key)
        rule = default_rule(key)
        rule = Rule(key, False, rule.action, rule.params) if row is None else rule_of_row(row, rule)
        items.append({"spec": RULES[key], "rule": rule, "row": row})
    return items


# --- the contributor's rejection inbox -------------------------------------------------------------


@dataclass(frozen=True)
class InboxEntry:
    """One of the contributor's groups that is out of the pool, and why.

    state: "rejected" (by the verifier or a moderator), "quarantined" or "held" (waiting for review).
    code: the verifier's reason code, "moderator" or the automatic rule's key. reason: text to show.
    """

    rollout: Rollout
    state: str
    code: str
    reason: str
    decided_at: datetime


def _inbox_entry(rollout: Rollout) -> InboxEntry:
    decision = getattr(rollout, "moderation_decision", None) if _has_decision(rollout) else None
    if rollout.verdict == Verdict.REJECTED and rollout.moderation_status == ModerationStatus.OK:
        label = RejectReason(rollout.reason).label if rollout.reason in RejectReason.values else rollout.reason
        return InboxEntry(rollout, "rejected", rollout.reason, f"Verification: {label}.", rollout.created_at)
    state = "rejected" if rollout.moderation_status == ModerationStatus.REJECTED else rollout.moderation_status
    if decision is not None:
        code = decision.rule or "moderator"
        prefix = "Automatic filter" if decision.rule else "Moderator"
        return InboxEntry(rollout, state, code, f"{prefix}: {decision.reason}", decision.decided_at)
    return InboxEntry(rollout, state, "moderator", "Moderator decision.", rollout.created_at)


def _has_decision(rollout: Rollout) -> bool:
    try:
        rollout.moderation_decision  # noqa: B018 - loaded by select_related
    except Rollout.moderation_decision.RelatedObjectDoesNotExist:
        return False
    return True


def rollout_inbox_list(*, owner: User, limit: int = 50) -> list[InboxEntry]:
    """The contributor's groups that are out of the pool (verifier-rejected, quarantined, moderator-
    rejected, or held for review), newest first, each with its reason. One query."""
    rows = (
        Rollout.objects.filter(node__owner=owner)
        .filter(Q(verdict=Verdict.REJECTED) | ~Q(moderation_status=ModerationStatus.OK))
        .select_related("node", "moderation_decision")
        .order_by("-created_at", "id")[:limit]
    )
    return [_inbox_entry(r) for r in rows]
