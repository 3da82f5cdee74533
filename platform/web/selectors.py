"""Reads behind every page and API figure of the web app (the same functions feed both).

Per-node figures come from web.stats (folded totals plus live rows, one snapshot) and are cached
for FIGURES_CACHE_SECONDS, so a busy leaderboard costs one computation per few seconds whatever
its traffic. docs/leaderboard.md says how each figure is computed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.core.paginator import Page, Paginator
from django.db.models import Count, JSONField, OuterRef, Subquery, Sum
from django.utils import timezone

from accounts.models import User
from community.selectors import badges_of_users
from nodes.models import ONLINE_WINDOW, Node
from nodes.presence import PresenceUnknown, connected_among, connected_filter, is_connected, with_connected
from pool.limits import current_limits
from pool.models import Consumption, ModerationStatus, NodeRound, Rollout
from pool.selectors import sample_window
from swarms.models import Swarm
from web.arms import NodeHourCell, arm_of, compare_arms
from web.models import DatasetHour, NodeHour, NodeStats
from web.stats import (
    Measures,
    active_node_ids,
    live_rows,
    recent_average_credit,
    snapshot,
    stats_fold_if_due,
)
from web.teams import TEAM_SORTS, team_figures_all

FIGURES_CACHE_SECONDS = 5
PAGE_SIZE = 25
SWARM_CURVE_HOURS = 48
ACCURACY_DAYS = 7
NODE_CURVE_DAYS = 7
AHA_RECENT_CONSUMPTIONS = 5000
AHA_MIN_NODES = 2
POOL_COUNT_EXACT_BELOW = 100_000


class _Judged:
    """The verdict counts' derived figures, for a node's and a contributor's rows alike."""

    accepted: int
    rejected: int

    @property
    def judged(self) -> int:
        return self.accepted + self.rejected

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.judged if self.judged else None


@dataclass
class NodeFigures(_Judged):
    """One node's leaderboard figures. Self-reported: model_id, hardware, rounds."""

    node_id: int
    name: str
    owner_id: int
    contributor: str
    model_id: str
    hardware: str
    status: str
    last_seen_at: datetime | None
    public: bool  # neither the node nor its contributor is banned
    username: str = ""  # for the contributor's page; empty when their profile is private
    accepted: int = 0
    rejected: int = 0
    moderated: int = 0
    completions: int = 0
    verified_reward: float = 0.0
    helped: int = 0
    rounds: int = 0
    recent_credit: float = 0.0

    @property
    def mean_reward(self) -> float | None:
        return self.verified_reward / self.completions if self.completions else None


@dataclass
class ContributorFigures(_Judged):
    owner_id: int
    contributor: str
    username: str = ""  # for the contributor's page; empty when their profile is private
    badges: list[str] = field(default_factory=list)  # set for the rows of a page (leaderboard)
    nodes: int = 0
    models: list[str] = field(default_factory=list)
    last_seen_at: datetime | None = None
    accepted: int = 0
    rejected: int = 0
    completions: int = 0
    verified_reward: float = 0.0
    helped: int = 0
    rounds: int = 0
    recent_credit: float = 0.0


def _page_username(owner: User) -> str:
    return "" if owner.profile_private else owner.username


def _compute_node_figures(now: datetime) -> list[NodeFigures]:
    stats_fold_if_due()
    with snapshot():
        live = live_rows()
        folded = {s.node_id: s for s in NodeStats.objects.all()}
        ids = set(folded) | set(live.groups.by_node) | set(live.helped) | set(live.rounds)
        nodes = list(with_connected(Node.objects.filter(id__in=ids).select_related("owner"), now=now))
    connected = connected_among(nodes, now=now)
    figures = []
    for node in nodes:
        m = Measures()
        helped = rounds = 0
        if (s := folded.get(node.id)) is not None:
            m.add(
                Measures(
                    s.accepted_groups,
                    s.rejected_groups,
                    s.moderated_groups,
                    s.credited_completions,
                    s.verified_reward,
                    s.credit_growth,
                )
            )
            helped, rounds = s.helped, s.rounds
        if (extra := live.groups.by_node.get(node.id)) is not None:
            m.add(extra)
        helped += live.helped.get(node.id, 0)
        rounds += live.rounds.get(node.id, 0)
        figures.append(
            NodeFigures(
                node_id=node.id,
                name=node.name,
                owner_id=node.owner_id,
                contributor=node.owner.public_name,
                model_id=node.model_id,
                hardware=node.hardware,
                status=node.status_at(now, connected=is_connected(connected, node.id)),
                last_seen_at=node.last_seen_at,
                public=not node.is_banned,
                username=_page_username(node.owner),
                accepted=m.accepted,
                rejected=m.rejected,
                moderated=m.moderated,
                completions=m.completions,
                verified_reward=m.reward,
                helped=helped,
                rounds=rounds,
                recent_credit=recent_average_credit(m.growth, now=now),
            )
        )
    return figures


def node_figures_all() -> list[NodeFigures]:
    """Every node that has shared, been used or reported, with its figures (cached a few seconds)."""
    cached = cache.get("web:node-figures")
    if cached is None:
        cached = _compute_node_figures(timezone.now())
        cache.set("web:node-figures", cached, FIGURES_CACHE_SECONDS)
    return cached


def node_figures_for(nodes: list[Node]) -> dict[int, NodeFigures]:
    """Figures of the given nodes (a contributor's own), empty figures for those without any. Read them
    with nodes.presence.with_connected (nodes.selectors does) and their status costs no query."""
    now = timezone.now()
    known = {f.node_id: f for f in node_figures_all()}
    connected = connected_among(nodes, now=now)
    out = {}
    for node in nodes:
        status = node.status_at(now, connected=is_connected(connected, node.id))
        out[node.id] = known.get(node.id) or NodeFigures(
            node_id=node.id,
            name=node.name,
            owner_id=node.owner_id,
            contributor=node.owner.public_name,
            model_id=node.model_id,
            hardware=node.hardware,
            status=status,
            last_seen_at=node.last_seen_at,
            public=not node.is_banned,
            username=_page_username(node.owner),
        )
        # Name, status and self-description change faster than the cache: take them from the row.
        fig = out[node.id]
        fig.name, fig.status, fig.last_seen_at = node.name, status, node.last_seen_at
        fig.model_id, fig.hardware = node.model_id, node.hardware
    return out


# ---------------------------------------------------------------------------- leaderboard

NODE_SORTS = {
    "reward": lambda f: f.verified_reward,
    "recent": lambda f: f.recent_credit,
    "helped": lambda f: f.helped,
    "accepted": lambda f: f.accepted,
    "rejected": lambda f: f.rejected,
    "rate": lambda f: -1.0 if f.acceptance_rate is None else f.acceptance_rate,
    "rounds": lambda f: f.rounds,
    "seen": lambda f: f.last_seen_at.timestamp() if f.last_seen_at else 0.0,
    "name": lambda f: f.name.lower(),
}
CONTRIBUTOR_SORTS = {**NODE_SORTS, "name": lambda f: f.contributor.lower(), "nodes": lambda f: f.nodes}
VIEWS = ("contributors", "nodes", "teams")
BOARD_SORTS = {"contributors": CONTRIBUTOR_SORTS, "nodes": NODE_SORTS, "teams": TEAM_SORTS}


def _listed(f: NodeFigures) -> bool:
    """On the public leaderboard and in the swarm's node count: not banned, and at least one group the
    verifier accepted (a node that only reports, or only shares junk, earns no row)."""
    return f.public and f.accepted > 0


def listed_node_figures() -> list[NodeFigures]:
    """The nodes the public leaderboard lists (`_listed`), with their figures."""
    return [f for f in node_figures_all() if _listed(f)]


def contributor_figures_all() -> list[ContributorFigures]:
    by_owner: dict[int, ContributorFigures] = {}
    for f in node_figures_all():
        if not _listed(f):
            continue
        c = by_owner.setdefault(
            f.owner_id, ContributorFigures(owner_id=f.owner_id, contributor=f.contributor, username=f.username)
        )
        c.nodes += 1
        if f.model_id and f.model_id not in c.models:
            c.models.append(f.model_id)
        if f.last_seen_at and (c.last_seen_at is None or f.last_seen_at > c.last_seen_at):
            c.last_seen_at = f.last_seen_at
        c.accepted += f.accepted
        c.rejected += f.rejected
        c.completions += f.completions
        c.verified_reward += f.verified_reward
        c.helped += f.helped
        c.rounds += f.rounds
        c.recent_credit += f.recent_credit
    return list(by_owner.values())


@dataclass
class Leaderboard:
    view: str
    sort: str
    descending: bool
    page: Page
    total: int


def leaderboard(*, view: str = "contributors", sort: str = "reward", order: str = "desc", page: Any = 1) -> Leaderboard:
    """One sorted page of the public leaderboard; unknown parameters fall back to the defaults."""
    view = view if view in VIEWS else "contributors"
    sorts = BOARD_SORTS[view]
    sort = sort if sort in sorts else "reward"
    descending = order != "asc"
    if view == "contributors":
        rows: list[Any] = contributor_figures_all()
    elif view == "nodes":
        rows = listed_node_figures()
    else:
        rows = team_figures_all()
    # Ties broken by name, so the order is stable between polls.
    rows.sort(key=lambda f: (f.contributor if view == "contributors" else f.name).lower())
    rows.sort(key=sorts[sort], reverse=descending)
    page_rows = Paginator(rows, PAGE_SIZE).get_page(page)
    if view == "contributors":
        badges = badges_of_users(f.owner_id for f in page_rows.object_list)
        for f in page_rows.object_list:
            f.badges = badges.get(f.owner_id, [])
    return Leaderboard(view, sort, descending, page_rows, len(rows))


# ---------------------------------------------------------------------------- swarm


def _rate(reward: float, completions: int) -> float | None:
    return reward / completions if completions else None


def swarm_overview(*, swarm: Swarm | None = None) -> dict[str, Any]:
    """The swarm page's figures, of the whole site or of one swarm (cached a few seconds)."""
    key = "web:swarm" if swarm is None else f"web:swarm:{swarm.id}"
    cached = cache.get(key)
    if cached is None:
        cached = _compute_swarm(timezone.now(), swarm)
        cache.set(key, cached, FIGURES_CACHE_SECONDS)
    return cached


#: A node counts among a swarm's nodes online when it is online and its groups or round reports
#: entered that swarm this recently (a socket's swarm is not recorded in presence).
SWARM_ACTIVE_WINDOW = timedelta(minutes=10)


def _swarm_node_ids(swarm_id: int, since: datetime) -> set[int]:
    """Nodes with groups or round reports in the swarm since `since` (index ranges: the groups'
    (swarm_id, created_at) partial index, and the rounds' swarm_id index)."""
    shared = Rollout.objects.filter(swarm_id=swarm_id, created_at__gte=since).values_list("node_id", flat=True)
    reported = NodeRound.objects.filter(swarm_id=swarm_id, updated_at__gte=since).values_list("node_id", flat=True)
    return set(shared.distinct()) | set(reported.distinct())


def _compute_swarm(now: datetime, swarm: Swarm | None = None) -> dict[str, Any]:
    swarm_id = None if swarm is None else swarm.id
    public = [f for f in node_figures_all() if f.public]
    try:
        online_nodes = Node.objects.filter(
            connected_filter(now=now),
            last_seen_at__gte=now - ONLINE_WINDOW,
            retired_at__isnull=True,
            banned_at__isnull=True,
            owner__banned_at__isnull=True,
        )
    except PresenceUnknown:  # shown as unknown, not as 0
        online_nodes = None
    recent_window = timedelta(minutes=10)
    recent = Rollout.objects.filter(created_at__gte=now - recent_window)
    if swarm_id is None:
        recent = recent.filter(node_id__in=active_node_ids(now - recent_window))
    else:
        # A swarm's figures: its own groups, and the nodes active in it (a node may move between swarms).
        in_swarm = _swarm_node_ids(swarm_id, now - SWARM_ACTIVE_WINDOW)
        public = [f for f in public if f.node_id in in_swarm]
        if online_nodes is not None:
            online_nodes = online_nodes.filter(id__in=in_swarm)
        recent = recent.filter(swarm_id=swarm_id)
    figures = [f for f in public if _listed(f)]
    online: int | None = None if online_nodes is None else online_nodes.count()
    recent_groups = recent.count()
    window = current_limits().sample_window_seconds
    if swarm is not None and swarm.sample_window_seconds:
        window = swarm.sample_window_seconds
    swarm_ids = [swarm_id] if swarm_id is not None else list(Swarm.objects.values_list("id", flat=True))
    pool_size = _pool_size(now - timedelta(seconds=window), swarm_ids)

    curve_start = (now - timedelta(hours=SWARM_CURVE_HOURS)).replace(minute=0, second=0, microsecond=0)
    accuracy_start = now - timedelta(days=ACCURACY_DAYS)
    dataset_hours = DatasetHour.objects.all() if swarm_id is None else DatasetHour.objects.filter(swarm_id=swarm_id)
    with snapshot():
        live = live_rows()
        hours = list(dataset_hours.filter(hour__gte=min(curve_start, accuracy_start)))
        node_hours = list(NodeHour.objects.filter(hour__gte=curve_start))
        if swarm_id is None:
            accepted = sum(f.accepted for f in public)
            rejected = sum(f.rejected for f in public)
            verified = sum(f.verified_reward for f in public)
        else:  # all time, from the folded hours and the live rows
            totals = dataset_hours.aggregate(
                a=Sum("accepted_groups"), r=Sum("rejected_groups"), v=Sum("verified_reward")
            )
            accepted, rejected, verified = totals["a"] or 0, totals["r"] or 0, totals["v"] or 0.0
            for (s, _, _), m in live.groups.by_dataset_hour.items():
                if s == swarm_id:
                    accepted, rejected, verified = accepted + m.accepted, rejected + m.rejected, verified + m.reward
    per_hour: dict[datetime, Measures] = {}
    per_dataset: dict[str, Measures] = {}
    buckets = [
        (
            h.dataset,
            h.hour,
            Measures(h.accepted_groups, h.rejected_groups, 0, h.credited_completions, h.verified_reward),
        )
        for h in hours
    ]
    buckets += [(d, h, m) for (s, d, h), m in live.groups.by_dataset_hour.items() if swarm_id in (None, s)]
    for dataset, hour, m in buckets:
        if hour >= curve_start:
            per_hour.setdefault(hour, Measures()).add(m)
        if hour >= accuracy_start - timedelta(hours=1):
            per_dataset.setdefault(dataset, Measures()).add(m)
    return {
        "generated_at": now,
        "nodes_online": online,
        "nodes_total": len(figures),
        "groups_per_minute": recent_groups / (recent_window.total_seconds() / 60),
        "pool_size": pool_size,
        "pool_window_seconds": window,
        "accepted_groups": accepted,
        "rejected_groups": rejected,
        "acceptance_rate": accepted / (accepted + rejected) if accepted + rejected else None,
        "verified_reward": verified,
        "reward_curve": [
            {"hour": hour, "mean_reward": _rate(m.reward, m.completions), "groups": m.accepted + m.rejected}
            for hour, m in sorted(per_hour.items())
        ],
        "accuracy": [
            {
                "dataset": d,
                "accuracy": _rate(m.reward, m.completions),
                "completions": m.completions,
                "groups": m.accepted + m.rejected,
            }
            for d, m in sorted(per_dataset.items())
        ],
        "aha": aha_groups(swarm_id=swarm_id),
        "arms": _swarm_arms(node_hours, live.groups.by_node_hour, {f.node_id for f in public}, curve_start),
    }


def _swarm_arms(
    node_hours: list[NodeHour], live: dict[tuple[int, datetime], Measures], public: set[int], start: datetime
) -> dict[str, Any]:
    """Swarm against silo over the curve's hours (web.arms), public nodes only. A node-hour is the
    folded row plus the live rows of the same hour."""
    merged: dict[tuple[int, datetime], Measures] = {}
    for h in node_hours:
        if h.node_id in public:
            merged[(h.node_id, h.hour)] = Measures(completions=h.credited_completions, reward=h.verified_reward)
    for (node_id, hour), m in live.items():
        if node_id in public and hour >= start:
            merged.setdefault((node_id, hour), Measures()).add(m)
    cells = [NodeHourCell(node_id, hour, m.reward, m.completions) for (node_id, hour), m in merged.items()]
    return compare_arms(cells, node_arms({node_id for node_id, _ in merged}))


def node_arms(node_ids: set[int]) -> dict[int, str | None]:
    """Each node's arm, from its latest round report (one index probe per node: the subquery reads
    pool_noderound_unique (node, round) backwards, LIMIT 1)."""
    latest = NodeRound.objects.filter(node_id=OuterRef("pk")).order_by("-round").values("figures")[:1]
    rows = Node.objects.filter(id__in=node_ids).annotate(figures=Subquery(latest, output_field=JSONField()))
    return {node_id: arm_of(figures) for node_id, figures in rows.values_list("id", "figures")}


def _pool_size(cutoff: datetime, swarm_ids: Collection[int]) -> int:
    """Sampleable groups inside the window of these swarms. Per swarm, exact (an index count) while
    the window's range of sample numbers is small; above POOL_COUNT_EXACT_BELOW, that range itself: two
    index lookups, an upper bound off by the groups moderated out since (their numbers leave holes)."""
    size = 0
    for swarm_id in swarm_ids:
        window = sample_window(cutoff, swarm_id)
        if window is None:
            continue
        lo, hi = window
        if hi - lo + 1 > POOL_COUNT_EXACT_BELOW:
            size += hi - lo + 1
        else:
            size += Rollout.objects.filter(
                swarm_id=swarm_id, sampleable=True, created_at__gte=cutoff, sample_seq__gte=lo
            ).count()
    return size


def aha_groups(
    *, limit: int = 10, author_owner_ids: Collection[int] | None = None, swarm_id: int | None = None
) -> list[dict[str, Any]]:
    """Recent groups that several other nodes trained on, most used first (from the latest
    AHA_RECENT_CONSUMPTIONS consumptions: a bounded read of the newest ids); `author_owner_ids`
    keeps the groups of those contributors' nodes (a team's members), `swarm_id` one swarm's groups."""
    recent = Consumption.objects.order_by("-id").values_list("id", flat=True)[
        AHA_RECENT_CONSUMPTIONS - 1 : AHA_RECENT_CONSUMPTIONS
    ]
    floor = next(iter(recent), 0)
    consumptions = Consumption.objects.filter(id__gte=floor)
    if author_owner_ids is not None:
        consumptions = consumptions.filter(author__owner_id__in=list(author_owner_ids))
    if swarm_id is not None:
        consumptions = consumptions.filter(swarm_id=swarm_id)
    rows = list(
        consumptions.values("rollout_id")
        .annotate(nodes=Count("consumer_id", distinct=True))
        .filter(nodes__gte=AHA_MIN_NODES)
        .order_by("-nodes", "rollout_id")[:limit]
    )
    rollouts = Rollout.objects.filter(
        id__in=[r["rollout_id"] for r in rows], moderation_status=ModerationStatus.OK
    ).select_related("node", "node__owner")
    by_id = {r.id: r for r in rollouts}
    out = []
    for row in rows:
        rollout = by_id.get(row["rollout_id"])
        if rollout is None or rollout.node.is_banned:
            continue
        rewards = rollout.verified_rewards or []
        out.append(
            {
                "id": rollout.id,
                "dataset": rollout.dataset,
                "question": rollout.question[:200],
                "node": rollout.node.name,
                "contributor": rollout.node.owner.public_name,
                "nodes_trained": row["nodes"],
                "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                "created_at": rollout.created_at,
            }
        )
    return out


# ---------------------------------------------------------------------------- my nodes


def node_curve(*, node: Node, days: int = NODE_CURVE_DAYS) -> list[dict[str, Any]]:
    """A node's verified reward per hour over the last `days` days (hours with groups only)."""
    start = timezone.now() - timedelta(days=days)
    with snapshot():
        live = live_rows(node_ids=[node.id])
        hours = {
            h.hour: Measures(h.accepted_groups, h.rejected_groups, 0, h.credited_completions, h.verified_reward)
            for h in NodeHour.objects.filter(node=node, hour__gte=start)
        }
    for (node_id, hour), m in live.groups.by_node_hour.items():
        if node_id == node.id and hour >= start:
            hours.setdefault(hour, Measures()).add(m)
    return [
        {
            "hour": hour,
            "verified_reward": m.reward,
            "mean_reward": _rate(m.reward, m.completions),
            "accepted": m.accepted,
            "rejected": m.rejected,
        }
        for hour, m in sorted(hours.items())
    ]


def last_reports(*, nodes: list[Node]) -> dict[int, NodeRound]:
    """Each node's latest round report (self-reported figures)."""
    rows = NodeRound.objects.filter(node__in=nodes).order_by("node_id", "-round").distinct("node_id")
    return {r.node_id: r for r in rows}
