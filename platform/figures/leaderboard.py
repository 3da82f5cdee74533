"""Per-node, per-contributor and leaderboard figures, of the whole site or of one swarm
(docs/figures.md). The same functions feed the pages, the JSON API, the badges and the export.

A node's figures are its folded totals (NodeStats; per swarm NodeSwarmStats) plus the live rows the
fold has not counted yet (figures.stats), read in one snapshot, and cached for FIGURES_CACHE_SECONDS
per swarm, so a busy leaderboard costs one computation per few seconds whatever its traffic. A swarm's
figures are the same computation narrowed to that swarm's rows: a node's figures over its swarms add
up to its total.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.core.paginator import Page, Paginator
from django.utils import timezone

from accounts.models import User
from community.selectors import badges_of_users
from figures import credit
from figures.models import NodeStats, NodeSwarmStats
from figures.stats import Measures, live_rows, measures_of, snapshot, stats_fold_if_due
from figures.teams import TEAM_SORTS, team_figures_all
from nodes.models import Node
from nodes.presence import connected_among, is_connected, with_connected
from swarms.models import Swarm
from swarms.scope import SITE, Scope

FIGURES_CACHE_SECONDS = 5
PAGE_SIZE = 25


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


def _folded_and_live(
    scope: Scope,
) -> tuple[dict[int, Any], dict[int, Measures], dict[int, int], dict[int, int]]:
    """Per node: its folded row, its live measures, live helped and live rounds; in `scope`."""
    live = live_rows()
    if scope.is_site:
        folded = {s.node_id: s for s in NodeStats.objects.all()}
        groups = live.groups.by_node
    else:
        folded = {s.node_id: s for s in NodeSwarmStats.objects.filter(swarm_id=scope.swarm_id)}
        groups = {n: m for (n, s), m in live.groups.by_node_swarm.items() if s == scope.swarm_id}
    helped: dict[int, int] = {}
    rounds: dict[int, int] = {}
    for counts, out in ((live.helped, helped), (live.rounds, rounds)):
        for (node_id, s), n in counts.items():
            if scope.holds(s):
                out[node_id] = out.get(node_id, 0) + n
    return folded, groups, helped, rounds


def _compute_node_figures(now: datetime, scope: Scope) -> list[NodeFigures]:
    stats_fold_if_due()
    with snapshot():
        folded, live_groups, live_helped, live_rounds = _folded_and_live(scope)
        ids = set(folded) | set(live_groups) | set(live_helped) | set(live_rounds)
        nodes = list(with_connected(Node.objects.filter(id__in=ids).select_related("owner"), now=now))
    connected = connected_among(nodes, now=now)
    figures = []
    for node in nodes:
        m = Measures()
        helped = rounds = 0
        if (s := folded.get(node.id)) is not None:
            m.add(measures_of(s))
            helped, rounds = s.helped, s.rounds
        if (extra := live_groups.get(node.id)) is not None:
            m.add(extra)
        helped += live_helped.get(node.id, 0)
        rounds += live_rounds.get(node.id, 0)
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
                recent_credit=credit.recent_average_credit(m.growth, now=now),
            )
        )
    return figures


def node_figures_all(*, scope: Scope = SITE) -> list[NodeFigures]:
    """Every node that has shared, been used or reported in `scope` (the whole site unless given), with
    its figures there (cached a few seconds)."""
    Scope.check(scope)
    key = "figures:node-figures" if scope.is_site else f"figures:node-figures:{scope.swarm_id}"
    cached = cache.get(key)
    if cached is None:
        cached = _compute_node_figures(timezone.now(), scope)
        cache.set(key, cached, FIGURES_CACHE_SECONDS)
    return cached


def node_figures_for(nodes: list[Node]) -> dict[int, NodeFigures]:
    """Figures of the given nodes (a contributor's own), empty figures for those without any. Read them
    with nodes.presence.with_connected (nodes.selectors does) and their status costs no query."""
    now = timezone.now()
    known = {f.node_id: f for f in node_figures_all(scope=SITE)}
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


def listed(f: NodeFigures) -> bool:
    """On the public leaderboard and in the swarm's node count: not banned, and at least one group the
    verifier accepted (a node that only reports, or only shares junk, earns no row)."""
    return f.public and f.accepted > 0


def listed_node_figures(*, scope: Scope) -> list[NodeFigures]:
    """The nodes the public leaderboard lists (`listed`, on their figures over all swarms), with their
    figures in `scope`. Listing is decided on the totals, so a listed node's rows over the swarms add
    up to its total row, the groups of a swarm where it has no accepted group included."""
    if Scope.check(scope).is_site:
        return [f for f in node_figures_all(scope=SITE) if listed(f)]
    ids = {f.node_id for f in node_figures_all(scope=SITE) if listed(f)}
    return [f for f in node_figures_all(scope=scope) if f.node_id in ids]


def contributor_figures_all(*, scope: Scope) -> list[ContributorFigures]:
    """Each contributor's listed nodes added up, in `scope`."""
    by_owner: dict[int, ContributorFigures] = {}
    for f in listed_node_figures(scope=scope):
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


def leaderboard(
    *, view: str = "contributors", sort: str = "reward", order: str = "desc", page: Any = 1, scope: Scope
) -> Leaderboard:
    """One sorted page of the public leaderboard, of the whole site (`Scope.site()`) or of one swarm;
    unknown parameters fall back to the defaults."""
    Scope.check(scope)
    view = view if view in VIEWS else "contributors"
    sorts = BOARD_SORTS[view]
    sort = sort if sort in sorts else "reward"
    descending = order != "asc"
    if view == "contributors":
        rows: list[Any] = contributor_figures_all(scope=scope)
    elif view == "nodes":
        rows = listed_node_figures(scope=scope)
    else:
        rows = team_figures_all(scope=scope)
    # Ties broken by name, so the order is stable between polls.
    rows.sort(key=lambda f: (f.contributor if view == "contributors" else f.name).lower())
    rows.sort(key=sorts[sort], reverse=descending)
    page_rows = Paginator(rows, PAGE_SIZE).get_page(page)
    if view == "contributors":
        badges = badges_of_users((f.owner_id for f in page_rows.object_list), scope=scope)
        for f in page_rows.object_list:
            f.badges = badges.get(f.owner_id, [])
    return Leaderboard(view, sort, descending, page_rows, len(rows))


@dataclass
class SwarmFigures(_Judged):
    """Some nodes' figures in one swarm (a public page's "by swarm" table)."""

    swarm: Swarm
    accepted: int = 0
    rejected: int = 0
    completions: int = 0
    verified_reward: float = 0.0
    helped: int = 0
    rounds: int = 0
    recent_credit: float = 0.0


def swarm_figures_of(*, node_ids: list[int]) -> list[SwarmFigures]:
    """These nodes' figures together in each swarm they have any in (folded NodeSwarmStats rows plus
    live rows, one snapshot), in the swarms' order; they add up to the nodes' figures in total."""
    if not node_ids:
        return []
    now = timezone.now()
    stats_fold_if_due()
    measures: dict[int, Measures] = {}
    counts: dict[int, list[int]] = {}
    with snapshot():
        live = live_rows(node_ids=node_ids)
        for s in NodeSwarmStats.objects.filter(node_id__in=node_ids):
            measures.setdefault(s.swarm_id, Measures()).add(measures_of(s))
            c = counts.setdefault(s.swarm_id, [0, 0])
            c[0], c[1] = c[0] + s.helped, c[1] + s.rounds
    wanted = set(node_ids)
    for (node_id, swarm_id), m in live.groups.by_node_swarm.items():
        if node_id in wanted:
            measures.setdefault(swarm_id, Measures()).add(m)
    for i, live_counts in enumerate((live.helped, live.rounds)):
        for (node_id, swarm_id), n in live_counts.items():
            if node_id in wanted:
                counts.setdefault(swarm_id, [0, 0])[i] += n
    swarm_ids = set(measures) | set(counts)
    out = []
    for swarm in Swarm.objects.filter(id__in=swarm_ids):
        m = measures.get(swarm.id, Measures())
        helped, rounds = counts.get(swarm.id, [0, 0])
        out.append(
            SwarmFigures(
                swarm=swarm,
                accepted=m.accepted,
                rejected=m.rejected,
                completions=m.completions,
                verified_reward=m.reward,
                helped=helped,
                rounds=rounds,
                recent_credit=credit.recent_average_credit(m.growth, now=now),
            )
        )
    return out
