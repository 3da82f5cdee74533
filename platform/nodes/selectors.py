from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from accounts.models import User
from common.errors import NotFound
from nodes.models import ONLINE_WINDOW, Node, NodeStatus, NodeToken
from nodes.presence import connected_among, is_connected, with_connected
from sapo_node.protocol import NODE_PREPARING


def _with_details(queryset: QuerySet[Node]) -> QuerySet[Node]:
    """Owner and presence (for status) and active tokens (as `active_tokens`) in a fixed number of queries."""
    return with_connected(queryset.select_related("owner")).prefetch_related(
        Prefetch("tokens", queryset=NodeToken.objects.filter(revoked_at__isnull=True), to_attr="active_tokens")
    )


def node_list(*, owner: User, include_retired: bool = False) -> QuerySet[Node]:
    queryset = Node.objects.filter(owner=owner)
    if not include_retired:
        queryset = queryset.filter(retired_at__isnull=True)
    return _with_details(queryset).order_by("created_at", "id")


def node_get(*, node_id: int) -> Node | None:
    return _with_details(Node.objects.filter(id=node_id)).first()


def node_statuses(nodes: Iterable[Node]) -> dict[int, str]:
    """Each node's status now (Node.status_at), asking nodes.presence once for the whole listing (not at
    all when the nodes were read with presence.with_connected and presence is in the database)."""
    nodes = list(nodes)
    now = timezone.now()
    connected = connected_among(nodes, now=now) if nodes else set()
    return {node.id: node.status_at(now, connected=is_connected(connected, node.id)) for node in nodes}


def node_status(node: Node) -> str:
    """One node's status now (node_statuses for a listing)."""
    return node_statuses([node])[node.id]


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


#: How long the site waits for a connected node's client to say it holds the site's pause before it
#: says the client is too old to (a current client says so within a second; docs/node.md).
PAUSE_ANSWER_WINDOW = timedelta(seconds=20)


@dataclass(frozen=True)
class NodeActivity:
    """What a node's client says it is doing (self-reported), and where its owner's pause stands."""

    #: protocol.NODE_STATES's word while the node is connected and said it lately; "" otherwise.
    state: str
    #: "" (not paused), "paused" (its client holds the pause), "requested" (the client has not said so
    #: yet), "too_old" (connected, and its client did not say so in PAUSE_ANSWER_WINDOW: it predates
    #: pausing) or "offline" (it stays paused when it connects).
    pause: str
    round_seconds: float | None
    tokens_per_second: float | None
    #: While its state is "preparing": what it does (sapo_node.protocol.PREPARING_STEPS, "" if not said),
    #: how far (0 to 1) and the seconds it said were left, each None when not said.
    preparing: str = ""
    progress: float | None = None
    eta_seconds: float | None = None


def node_activity(node: Node, *, status: str, now: datetime | None = None) -> NodeActivity:
    """`node`'s activity, given its status (node_statuses, or its figures'): no query."""
    now = now or timezone.now()
    connected = status in (NodeStatus.ONLINE, NodeStatus.IDLE)
    said_lately = node.reported_at is not None and now - node.reported_at <= ONLINE_WINDOW
    pause = ""
    if node.paused_at is not None:
        answered = node.reported_paused and node.reported_at is not None and node.reported_at >= node.paused_at
        if not connected:
            pause = "offline"
        elif answered:
            pause = "paused"
        elif now - node.paused_at < PAUSE_ANSWER_WINDOW:
            pause = "requested"
        else:
            pause = "too_old"
    state = node.reported_state if connected and said_lately else ""
    preparing = state == NODE_PREPARING
    return NodeActivity(
        state=state,
        pause=pause,
        round_seconds=node.round_seconds,
        tokens_per_second=node.tokens_per_second,
        preparing=node.reported_preparing if preparing else "",
        progress=node.reported_progress if preparing else None,
        eta_seconds=node.reported_eta_seconds if preparing else None,
    )


def node_activities(nodes: Iterable[Node], statuses: dict[int, str]) -> dict[int, NodeActivity]:
    """node_activity of each node, by id (`statuses`: node id -> status)."""
    now = timezone.now()
    return {node.id: node_activity(node, status=statuses.get(node.id, ""), now=now) for node in nodes}
