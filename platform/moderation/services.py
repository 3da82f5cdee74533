"""Moderators' writes: group decisions (single and bulk), node and contributor bans, rule changes.

Every function writes one AuditEntry (append-only) in the same transaction as the change it records,
and works set-based: a bulk action is a fixed number of statements whatever it matches.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Q, QuerySet
from django.utils import timezone
from psycopg import sql

from accounts.events import contributor_withdrawn_on_commit, node_withdrawn_on_commit
from accounts.models import User
from common.errors import ApplicationError
from moderation.models import (
    REASON_MAX_LENGTH,
    AuditAction,
    AuditEntry,
    ModerationDecision,
    ModerationFlag,
    ModerationRule,
    TargetType,
)
from moderation.rules import RULES, RuleError, clean_params, rules_forget
from moderation.selectors import rule_swarm_id
from moderation.trust import trust_reset
from nodes.events import CLOSE_BANNED, contributor_disconnect_on_commit, node_disconnect_on_commit
from nodes.models import Node
from pool.models import ModerationStatus, Rollout
from pool.services import rollout_set_moderation
from swarms.models import Swarm
from swarms.scope import Scope

#: Queue actions and the moderation status each sets.
ACTIONS = {
    "quarantine": ModerationStatus.QUARANTINED,
    "restore": ModerationStatus.OK,
    "reject": ModerationStatus.REJECTED,
}


def _clean_reason(reason: object) -> str:
    text = " ".join(str(reason or "").split())
    if not text:
        raise ApplicationError("reason_required", "A reason is required.")
    if len(text) > REASON_MAX_LENGTH:
        raise ApplicationError("reason_too_long", f"A reason has at most {REASON_MAX_LENGTH} characters.")
    return text


def _action_status(action: str) -> str:
    try:
        return ACTIONS[action]
    except KeyError:
        raise ApplicationError("invalid_action", f"Unknown action {action!r}.") from None


def _audit(
    *,
    actor: User | None,
    action: str,
    target_type: str,
    target_id: object = "",
    count: int = 1,
    reason: str = "",
    details: dict[str, Any] | None = None,
    rule: str = "",
) -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor,
        rule=rule,
        action=action,
        target_type=target_type,
        target_id=str(target_id),
        count=count,
        reason=reason,
        details=details or {},
    )


def audit_staff_action(
    *,
    actor: User,
    action: str,
    target_type: str,
    target_id: object,
    reason: object,
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    """Record a staff action taken in a higher app (community's team moderation) in the audit log,
    inside the caller's transaction. Raises ApplicationError: reason_required, reason_too_long."""
    return _audit(
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        reason=_clean_reason(reason),
        details=details,
    )


_DECIDE_SQL = sql.SQL("""
INSERT INTO moderation_moderationdecision (rollout_id, status, reason, rule, actor_id, batch, decided_at)
SELECT s.id, %s, %s, '', %s, %s, %s FROM ({matched}) AS s
ON CONFLICT (rollout_id) DO UPDATE SET
    status = EXCLUDED.status, reason = EXCLUDED.reason, rule = '', actor_id = EXCLUDED.actor_id,
    batch = EXCLUDED.batch, decided_at = EXCLUDED.decided_at
""")


def _decide(*, rollouts: QuerySet[Rollout], status: str, reason: str, actor: User) -> tuple[uuid.UUID, int]:
    """Record a decision on every group the queryset matches and set their status, in 3 statements:
    upsert the decisions (INSERT ... SELECT, tagged with a fresh batch id), then the pool's own
    `rollout_set_moderation` on exactly that batch (it keeps `sampleable` and `sample_seq` consistent),
    then resolve the groups' open flags (the leaderboard follows the status change through
    pool.signals). Caller holds a transaction."""
    batch = uuid.uuid4()
    now = timezone.now()
    sub_sql, sub_params = rollouts.order_by().values("id").query.sql_with_params()
    with connection.cursor() as cursor:
        # Django's compiled query is a part of the statement (its own %s placeholders, bound with
        # sub_params), composed, not pasted into text.
        cursor.execute(
            _DECIDE_SQL.format(matched=sql.SQL(sub_sql)), [status, reason, actor.id, batch, now, *sub_params]
        )
        count = cursor.rowcount
    decided = Rollout.objects.filter(id__in=ModerationDecision.objects.filter(batch=batch).values("rollout_id"))
    rollout_set_moderation(rollouts=decided, status=status)
    ModerationFlag.objects.filter(rollout__in=decided, resolved_at__isnull=True).update(resolved_at=now)
    if status == ModerationStatus.REJECTED:
        per_node = dict(decided.values_list("node_id").annotate(n=Count("id")).order_by())
        trust_reset(node_ids=per_node, rejected_counts=per_node)
    return batch, count


@transaction.atomic
def rollout_moderate(*, actor: User, rollout_id: uuid.UUID | str, action: str, reason: str) -> Rollout:
    """Quarantine, restore or reject one group. Raises ApplicationError: invalid_action, reason_required,
    reason_too_long, not_found (404)."""
    status = _action_status(action)
    reason = _clean_reason(reason)
    try:
        rollout_id = uuid.UUID(str(rollout_id))
    except ValueError:
        raise ApplicationError("not_found", "No such group.", status=404) from None
    queryset = Rollout.objects.filter(id=rollout_id)
    batch, count = _decide(rollouts=queryset, status=status, reason=reason, actor=actor)
    if not count:
        raise ApplicationError("not_found", "No such group.", status=404)
    _audit(
        actor=actor,
        action=action,
        target_type=TargetType.ROLLOUT,
        target_id=rollout_id,
        reason=reason,
        details={"batch": str(batch)},
    )
    return Rollout.objects.select_related("node", "node__owner").get(id=rollout_id)


@transaction.atomic
def rollouts_moderate_bulk(
    *, actor: User, rollouts: QuerySet[Rollout], action: str, reason: str, description: dict[str, Any]
) -> int:
    """Apply an action to every group a queue filter matches (`description`: the filter, for the log).
    Returns how many groups it decided on."""
    status = _action_status(action)
    reason = _clean_reason(reason)
    batch, count = _decide(rollouts=rollouts, status=status, reason=reason, actor=actor)
    _audit(
        actor=actor,
        action=action,
        target_type=TargetType.ROLLOUT_FILTER,
        count=count,
        reason=reason,
        details={"filter": description, "batch": str(batch)},
    )
    return count


# --- bans -----------------------------------------------------------------------------------------

_BANNABLE = [ModerationStatus.OK, ModerationStatus.HELD]


def _restore_ban_batch(kind: _Bannable, *, actor: User, target_id: object, reason: str) -> int:
    """Restore the groups the latest ban of this target quarantined and nobody decided on since."""
    ban = (
        AuditEntry.objects.filter(target_type=kind.target_type, target_id=str(target_id), action=kind.ban)
        .order_by("-created_at", "-id")
        .first()
    )
    batch = (ban.details or {}).get("batch") if ban else None
    if not batch:
        return 0
    groups = Rollout.objects.filter(
        moderation_status=ModerationStatus.QUARANTINED,
        id__in=ModerationDecision.objects.filter(batch=batch).values("rollout_id"),
    )
    _, count = _decide(rollouts=groups, status=ModerationStatus.OK, reason=f"unbanned: {reason}", actor=actor)
    return count


@dataclass(frozen=True)
class _Bannable:
    """What a ban acts on, a node or a contributor: its table, its groups, its audit entries' words,
    and how its open sockets are closed."""

    model: type[Node] | type[User]
    target_type: str
    ban: str  # AuditAction
    unban: str
    groups: Callable[[int], Q]  # its groups, by its id
    label: str  # in the quarantine decisions' reason
    name_key: str  # its name's key in the audit entries' details
    disconnect: Callable[[int], None]  # on commit, with CLOSE_BANNED
    withdraw: Callable[[int], None]  # on commit: out of what the site published (accounts.events)


_NODE = _Bannable(
    model=Node,
    target_type=TargetType.NODE,
    ban=AuditAction.BAN_NODE,
    unban=AuditAction.UNBAN_NODE,
    groups=lambda node_id: Q(node_id=node_id),
    label="node",
    name_key="node",
    disconnect=lambda node_id: node_disconnect_on_commit(node_id=node_id, code=CLOSE_BANNED, reason="banned"),
    withdraw=lambda node_id: node_withdrawn_on_commit(node_id=node_id),
)
_CONTRIBUTOR = _Bannable(
    model=User,
    target_type=TargetType.CONTRIBUTOR,
    ban=AuditAction.BAN_CONTRIBUTOR,
    unban=AuditAction.UNBAN_CONTRIBUTOR,
    groups=lambda user_id: Q(node__owner_id=user_id),
    label="contributor",
    name_key="username",
    disconnect=lambda user_id: contributor_disconnect_on_commit(user_id=user_id, code=CLOSE_BANNED, reason="banned"),
    withdraw=lambda user_id: contributor_withdrawn_on_commit(user_id=user_id),
)


def _ban(kind: _Bannable, *, actor: User, target: Node | User, name: str, reason: str) -> None:
    """Set `target`'s ban, quarantine its groups (one bulk decision), audit, and close its sockets and
    withdraw it from the published export on commit. `reason` is already clean; the caller holds the
    transaction."""
    now = timezone.now()
    kind.model.objects.filter(id=target.id).update(banned_at=now)
    target.banned_at = now
    batch, count = _decide(
        rollouts=Rollout.objects.filter(kind.groups(target.id), moderation_status__in=_BANNABLE),
        status=ModerationStatus.QUARANTINED,
        reason=f"{kind.label} banned: {reason}",
        actor=actor,
    )
    _audit(
        actor=actor,
        action=kind.ban,
        target_type=kind.target_type,
        target_id=target.id,
        count=count,
        reason=reason,
        details={"batch": str(batch), kind.name_key: name},
    )
    kind.disconnect(target.id)
    kind.withdraw(target.id)


def _unban(kind: _Bannable, *, actor: User, target: Node | User, name: str, reason: str, restore_groups: bool) -> None:
    """Lift `target`'s ban; with `restore_groups`, the groups its ban quarantined go back; audit."""
    reason = _clean_reason(reason)
    kind.model.objects.filter(id=target.id).update(banned_at=None)
    target.banned_at = None
    count = _restore_ban_batch(kind, actor=actor, target_id=target.id, reason=reason) if restore_groups else 0
    _audit(
        actor=actor,
        action=kind.unban,
        target_type=kind.target_type,
        target_id=target.id,
        count=count,
        reason=reason,
        details={"restored": count, kind.name_key: name},
    )


@transaction.atomic
def node_ban(*, actor: User, node: Node, reason: str) -> Node:
    """Ban a node: refused at connect from now on (nodes.sessions), its open sockets closed with 4403
    on every server process (a socket order, nodes.events, in the ban's transaction), its groups
    quarantined (one bulk decision)."""
    _ban(_NODE, actor=actor, target=node, name=node.name, reason=_clean_reason(reason))
    return node


@transaction.atomic
def node_unban(*, actor: User, node: Node, reason: str, restore_groups: bool = True) -> Node:
    """Lift a node's ban; with `restore_groups`, the groups its ban quarantined go back to the pool."""
    _unban(_NODE, actor=actor, target=node, name=node.name, reason=reason, restore_groups=restore_groups)
    return node


@transaction.atomic
def contributor_ban(*, actor: User, user: User, reason: str) -> User:
    """Ban a contributor: all their nodes are refused and their open sockets closed with 4403 (one
    socket order naming the contributor, nodes.events), all their groups quarantined (one bulk decision).
    Raises ApplicationError "cannot_ban" for oneself or a staff account."""
    reason = _clean_reason(reason)
    if user.id == actor.id or user.is_staff:
        raise ApplicationError("cannot_ban", "Staff accounts (and yourself) cannot be banned.", status=409)
    _ban(_CONTRIBUTOR, actor=actor, target=user, name=user.username, reason=reason)
    return user


@transaction.atomic
def contributor_unban(*, actor: User, user: User, reason: str, restore_groups: bool = True) -> User:
    """Lift a contributor's ban; with `restore_groups`, the groups their ban quarantined go back."""
    _unban(_CONTRIBUTOR, actor=actor, target=user, name=user.username, reason=reason, restore_groups=restore_groups)
    return user


# --- rules and flags ------------------------------------------------------------------------------


def _swarm_slug(swarm_id: int) -> str:
    slug = Swarm.objects.filter(id=swarm_id).values_list("slug", flat=True).first()
    if slug is None:
        raise ApplicationError("unknown_swarm", "No such swarm.", status=404)
    return slug


@transaction.atomic
def rule_update(
    *, actor: User, key: str, enabled: bool, action: str, params: dict[str, Any], scope: Scope
) -> ModerationRule:
    """Switch or tune an automatic rule: the site's (`Scope.site()`), applied to every swarm's shares,
    or one swarm's own (`Scope.swarm(id)`), applied to that swarm's shares besides the site's (only the
    keys RuleSpec.per_swarm allows). Raises ApplicationError: unknown_rule (404), invalid_rule,
    unknown_swarm (404)."""
    spec = RULES.get(key)
    if spec is None:
        raise ApplicationError("unknown_rule", f"No rule {key!r}.", status=404)
    slug = None if Scope.check(scope).is_site else _swarm_slug(scope.swarm_id)
    if slug is not None and not spec.per_swarm:
        raise ApplicationError("invalid_rule", f"The rule {key!r} is the site's only; a swarm cannot have its own.")
    if not isinstance(params, dict):
        raise ApplicationError("invalid_rule", "Parameters must be a JSON object.")
    try:
        cleaned = clean_params(key, params)
    except RuleError as exc:
        raise ApplicationError("invalid_rule", str(exc)) from exc
    if action not in ("flag", "hold"):
        raise ApplicationError("invalid_rule", "The action is 'flag' or 'hold'.")
    row, created = ModerationRule.objects.select_for_update().get_or_create(key=key, swarm_id=rule_swarm_id(scope))
    # The site's rules have a row from the start (migrations), a swarm's only once edited.
    before = (
        None if created and slug is not None else {"enabled": row.enabled, "action": row.action, "params": row.params}
    )
    row.enabled = bool(enabled) if spec.switchable else True
    row.action = action if spec.has_action else spec.action
    row.params = cleaned
    row.updated_at = timezone.now()
    row.updated_by = actor
    row.save()
    after = {"enabled": row.enabled, "action": row.action, "params": row.params}
    details: dict[str, Any] = {"before": before, "after": after}
    if slug is not None:
        details["swarm"] = slug
    _audit(
        actor=actor,
        action=AuditAction.RULE_CHANGE,
        target_type=TargetType.RULE,
        target_id=key,
        reason="rule settings changed" if slug is None else f"rule settings of swarm {slug} changed",
        details=details,
    )
    transaction.on_commit(rules_forget)
    return row


@transaction.atomic
def flag_resolve(*, actor: User, flag_id: int, reason: str) -> ModerationFlag:
    """Dismiss an open flag (e.g. an outlier node judged honest). Raises not_found (404)."""
    reason = _clean_reason(reason)
    flag = ModerationFlag.objects.select_for_update().filter(id=flag_id, resolved_at__isnull=True).first()
    if flag is None:
        raise ApplicationError("not_found", "No such open flag.", status=404)
    flag.resolved_at = timezone.now()
    flag.save(update_fields=["resolved_at"])
    _audit(
        actor=actor,
        action=AuditAction.FLAG_RESOLVE,
        target_type=TargetType.NODE if flag.rollout_id is None else TargetType.ROLLOUT,
        target_id=flag.rollout_id or flag.node_id,
        reason=reason,
        details={"flag": flag.id, "rule": flag.rule},
    )
    return flag
