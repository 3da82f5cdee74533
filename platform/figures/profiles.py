"""Public pages of a contributor (/contributors/<username>/) and of a node (/nodes/<id>/): who may see
them, and what they show. docs/community.md#public-pages.

A private profile (accounts.User.profile_private), a banned contributor or a banned node answers
NotFound to everyone but the contributor themself (a banned one sees /me/ instead): the same answer
as for a name that does not exist, so a private profile cannot be told from none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from accounts.models import User
from common.errors import NotFound
from community.models import Team
from community.selectors import badges_of_users, current_teams_of
from figures.datasets import datasets_by_day
from figures.leaderboard import NodeFigures, SwarmFigures, node_figures_for, swarm_figures_of
from figures.models import NodeHour
from figures.stats import Measures, live_rows, measures_of, snapshot
from nodes.models import Node
from nodes.presence import with_connected
from swarms.scope import SITE

#: A node's curve on /me/ and the public pages' curves cover this many days.
NODE_CURVE_DAYS = 7
#: The per-dataset figures read the newest groups of the last NODE_CURVE_DAYS days, at most this many
#: (the pool's (node, created_at) index): a bounded read, whatever the contributor's volume.
DATASET_GROUPS_MAX = 20_000


def _may_see(owner: User, viewer: User | None) -> bool:
    if viewer is not None and viewer.is_authenticated and viewer.id == owner.id:
        return True
    return not owner.profile_private and owner.banned_at is None


def contributor_public_get(*, username: str, viewer: User | None) -> User:
    """The contributor whose public page this is. Raises NotFound (unknown, private, banned)."""
    owner = User.objects.filter(username=str(username)[:150]).first()
    if owner is None or not _may_see(owner, viewer):
        raise NotFound("No such contributor.")
    return owner


def node_public_get(*, node_id: int, viewer: User | None) -> Node:
    """A node's public page. Raises NotFound (unknown, banned, or its contributor private or banned)."""
    node = with_connected(Node.objects.select_related("owner").filter(id=node_id)).first()
    if node is None or not _may_see(node.owner, viewer) or node.banned_at is not None:
        raise NotFound("No such node.")
    return node


def _curve(node_ids: list[int], start: datetime) -> list[dict[str, Any]]:
    """Verified reward per hour of these nodes together since `start` (folded hours plus live rows)."""
    with snapshot():
        live = live_rows(node_ids=node_ids)
        hours: dict[datetime, Measures] = {}
        for h in NodeHour.objects.filter(node_id__in=node_ids, hour__gte=start):
            hours.setdefault(h.hour, Measures()).add(measures_of(h))
    for (node_id, hour), m in live.groups.by_node_hour.items():
        if node_id in node_ids and hour >= start:
            hours.setdefault(hour, Measures()).add(m)
    return [
        {
            "hour": hour,
            "verified_reward": m.reward,
            "accepted": m.accepted,
            "rejected": m.rejected,
            "mean_reward": m.reward / m.completions if m.completions else None,
        }
        for hour, m in sorted(hours.items())
    ]


def node_curve(*, node: Node, days: int = NODE_CURVE_DAYS) -> list[dict[str, Any]]:
    """A node's verified reward per hour over the last `days` days (hours with groups only)."""
    return _curve([node.id], timezone.now() - timedelta(days=days))


def _datasets(node_ids: list[int], start: datetime) -> list[dict[str, Any]]:
    """Per dataset and day since `start`: accepted groups, verified reward, reward per completion."""
    rows = datasets_by_day(node_ids=node_ids, since=start, limit=DATASET_GROUPS_MAX)
    return [
        {
            "dataset": dataset,
            "day": day.date(),
            "accepted": int(accepted),
            "verified_reward": float(reward),
            "mean_reward": float(reward) / completions if completions else None,
        }
        for dataset, day, accepted, completions, reward in rows
    ]


def _dataset_totals(per_day: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset, most verified reward first: its totals and its verified reward on each of the
    days that have groups (`by_day`, aligned with `_days(per_day)`)."""
    days = _days(per_day)
    totals: dict[str, dict[str, Any]] = {}
    for row in per_day:
        t = totals.setdefault(
            row["dataset"],
            {"dataset": row["dataset"], "accepted": 0, "verified_reward": 0.0, "by_day": [0.0] * len(days)},
        )
        t["accepted"] += row["accepted"]
        t["verified_reward"] += row["verified_reward"]
        t["by_day"][days.index(row["day"])] += row["verified_reward"]
    return sorted(totals.values(), key=lambda t: -t["verified_reward"])


def _days(per_day: list[dict[str, Any]]) -> list[Any]:
    return sorted({row["day"] for row in per_day})


@dataclass
class Profile:
    """What a public page shows: totals, the nodes (or the one node), curve, datasets, badges, team."""

    owner: User
    nodes: list[NodeFigures]
    curve: list[dict[str, Any]]
    datasets: list[dict[str, Any]]
    badges: list[str] = field(default_factory=list)
    team: Team | None = None
    swarms: list[SwarmFigures] = field(default_factory=list)
    accepted: int = 0
    rejected: int = 0
    verified_reward: float = 0.0
    helped: int = 0
    recent_credit: float = 0.0
    last_seen_at: datetime | None = None

    @property
    def dataset_totals(self) -> list[dict[str, Any]]:
        return _dataset_totals(self.datasets)

    @property
    def dataset_days(self) -> list[Any]:
        return _days(self.datasets)


def _profile(owner: User, nodes: list[Node]) -> Profile:
    start = timezone.now() - timedelta(days=NODE_CURVE_DAYS)
    figures = node_figures_for(nodes)
    ids = [n.id for n in nodes]
    profile = Profile(
        owner=owner,
        nodes=[figures[n.id] for n in nodes],
        curve=_curve(ids, start),
        datasets=_datasets(ids, start),
        badges=badges_of_users([owner.id], scope=SITE).get(owner.id, []),
        team=current_teams_of([owner.id]).get(owner.id),
        swarms=swarm_figures_of(node_ids=ids),
    )
    for f in profile.nodes:
        profile.accepted += f.accepted
        profile.rejected += f.rejected
        profile.verified_reward += f.verified_reward
        profile.helped += f.helped
        profile.recent_credit += f.recent_credit
        if f.last_seen_at and (profile.last_seen_at is None or f.last_seen_at > profile.last_seen_at):
            profile.last_seen_at = f.last_seen_at
    return profile


def contributor_profile(*, owner: User) -> Profile:
    """The contributor's page: every node of theirs that is not banned (retired ones keep their history)."""
    nodes = list(
        with_connected(Node.objects.filter(owner=owner, banned_at__isnull=True).select_related("owner")).order_by(
            "created_at", "id"
        )
    )
    return _profile(owner, nodes)


def node_profile(*, node: Node) -> Profile:
    return _profile(node.owner, [node])
