"""Reads behind the pages that are not figures: a contributor's nodes' latest round reports and
swarms (a page's swarm picker is swarms.selectors.swarm_pick). The figures are the `figures` app's (figures.swarm,
figures.leaderboard, figures.profiles); docs/figures.md says how each is computed.
"""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import OuterRef, Subquery

from nodes.models import Node
from pool.models import NodeRound, Rollout
from swarms.models import Swarm


def last_reports(*, nodes: list[Node]) -> dict[int, NodeRound]:
    """Each node's latest round report (self-reported figures)."""
    rows = NodeRound.objects.filter(node__in=nodes).order_by("node_id", "-round").distinct("node_id")
    return {r.node_id: r for r in rows}


def node_swarms(*, nodes: Collection[Node]) -> dict[int, Swarm]:
    """Each node's swarm: the one of its latest round report or of its latest shared group, whichever
    came last (a node is in one swarm at a time; its hello names it). Nodes that have done neither are
    absent. Two queries whatever the number of nodes."""
    ids = [node.id for node in nodes]
    if not ids:
        return {}

    def latest(model, field: str):
        return Subquery(model.objects.filter(node=OuterRef("pk")).order_by("-created_at").values(field)[:1])

    rows = Node.objects.filter(id__in=ids).values_list(
        "id",
        latest(NodeRound, "swarm_id"),
        latest(NodeRound, "created_at"),
        latest(Rollout, "swarm_id"),
        latest(Rollout, "created_at"),
    )
    chosen: dict[int, int] = {}
    for node_id, round_swarm, round_at, group_swarm, group_at in rows:
        if round_swarm is not None and (group_at is None or round_at >= group_at):
            chosen[node_id] = round_swarm
        elif group_swarm is not None:
            chosen[node_id] = group_swarm
    swarms = Swarm.objects.in_bulk(set(chosen.values()))
    return {node_id: swarms[swarm_id] for node_id, swarm_id in chosen.items() if swarm_id in swarms}
