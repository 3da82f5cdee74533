"""The audits' parts of the node page and /me/ (audits.selectors feeds both): pending credit, a
node's hold, its latest audits, and a contributor's failed audits with their reason."""

from __future__ import annotations

from typing import Any

from django import template

from accounts.models import User
from audits.selectors import node_audit_list, node_hold_get, node_holds, owner_failed_audits, pending_credit
from nodes.models import Node

register = template.Library()


@register.inclusion_tag("web/partials/node_audits.html")
def node_audits(node: Node) -> dict[str, Any]:
    return {
        "node": node,
        "pending": pending_credit(node_ids=[node.id])[node.id],
        "hold": node_hold_get(node_id=node.id),
        "audits": node_audit_list(node_id=node.id, limit=10),
    }


@register.inclusion_tag("web/partials/my_audits.html")
def my_audits(user: User, nodes: list[Node]) -> dict[str, Any]:
    ids = [n.id for n in nodes]
    pending, holds = pending_credit(node_ids=ids), node_holds(node_ids=ids)
    return {
        "rows": [(n, pending[n.id], holds.get(n.id)) for n in nodes],
        "failed": owner_failed_audits(owner=user),
    }
