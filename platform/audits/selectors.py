"""Reads of audits: what a node must upload, and what its page and its contributor's page show."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import QuerySet
from django.utils import timezone
from psycopg import sql

from accounts.models import User
from audits.models import Audit, AuditBase, AuditState, NodeHold
from figures import credit


def node_requested_audits(*, node_id: int) -> QuerySet[Audit]:
    """The node's audits still waiting for its upload, deadline not passed, oldest first."""
    return Audit.objects.filter(node_id=node_id, state=AuditState.REQUESTED, deadline__gt=timezone.now()).order_by(
        "requested_at"
    )


def node_audit_list(*, node_id: int, limit: int = 20) -> list[Audit]:
    return list(Audit.objects.filter(node_id=node_id).order_by("-requested_at")[:limit])


def node_hold_get(*, node_id: int) -> NodeHold | None:
    return NodeHold.objects.filter(node_id=node_id, released_at=None).select_related("audit").first()


def node_holds(*, node_ids: list[int]) -> dict[int, NodeHold]:
    """The holds in force of these nodes, by node id (one query)."""
    return {h.node_id: h for h in NodeHold.objects.filter(node_id__in=node_ids, released_at=None)}


def owner_failed_audits(*, owner: User, limit: int = 20) -> list[Audit]:
    """The contributor's failed and expired audits, newest first: their rejection inbox says why."""
    return list(
        Audit.objects.filter(node__owner=owner, state__in=[AuditState.FAILED, AuditState.EXPIRED])
        .select_related("node")
        .order_by("-finished_at")[:limit]
    )


@dataclass(frozen=True)
class PendingCredit:
    """Groups with a valid proof that no audit has covered yet, and their reward (the credit rule's)."""

    groups: int
    reward: float


def pending_credit(*, node_ids: list[int]) -> dict[int, PendingCredit]:
    """Pending groups and reward per node (one aggregate)."""
    if not node_ids:
        return {}
    statement = sql.SQL(
        "SELECT r.node_id, count(*), coalesce(sum({reward}), 0) FROM pool_rollout r "
        "WHERE r.node_id = ANY(%s) AND r.audit_state = 'pending' AND r.verdict = %s AND r.moderation_status <> ALL(%s) "
        "GROUP BY r.node_id"
    ).format(reward=credit.reward("r"))
    with connection.cursor() as cursor:
        cursor.execute(statement, [list(node_ids), credit.ACCEPTED, list(credit.MODERATED_OUT)])
        rows = cursor.fetchall()
    found = {node_id: PendingCredit(groups, float(reward)) for node_id, groups, reward in rows}
    return {node_id: found.get(node_id, PendingCredit(0, 0.0)) for node_id in node_ids}


def audit_base_known(*, model: str, digest: str) -> bool:
    """Whether a worker of this site has built `model`'s base with these weights (audits.models.AuditBase)."""
    return AuditBase.objects.filter(model=model, digest=digest).exists()
