from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from accounts.models import User
from common.errors import NotFound
from nodes.models import Node, NodeToken


def _with_details(queryset: QuerySet[Node]) -> QuerySet[Node]:
    """Owner (for status) and active tokens (as `active_tokens`) in a fixed number of queries."""
    return queryset.select_related("owner").prefetch_related(
        Prefetch("tokens", queryset=NodeToken.objects.filter(revoked_at__isnull=True), to_attr="active_tokens")
    )


def node_list(*, owner: User, include_retired: bool = False) -> QuerySet[Node]:
    queryset = Node.objects.filter(owner=owner)
    if not include_retired:
        queryset = queryset.filter(retired_at__isnull=True)
    return _with_details(queryset).order_by("created_at", "id")


def node_get(*, node_id: int) -> Node | None:
    return _with_details(Node.objects.filter(id=node_id)).first()


def access_node(user: User, node_id: int | str) -> Node:
    """The gatekeeper: the node if `user` may manage it (its owner), else NotFound (404, code
    "not_found") -- the same answer whether the node is someone else's or does not exist."""
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise NotFound("Node not found.") from None
    if user is None or not user.is_authenticated:
        raise NotFound("Node not found.")
    node = node_get(node_id=node_id)
    if node is None or node.owner_id != user.id:
        raise NotFound("Node not found.")
    return node
