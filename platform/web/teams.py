"""Team figures: what members earned while members, from the folded per-hour table (NodeHour) plus
the live rows the fold has not counted yet, read in one snapshot (web.stats). docs/leaderboard.md#teams.

Credit is counted by the hour: a node's hour (web_nodehour.hour, its start) counts for a team when it
starts inside one of its owner's membership periods in that team (joined_at <= hour < left_at). Joining
in the middle of an hour counts from the next hour; the hour a member leaves in stays with the team.
No hour is ever counted for two teams (periods of one contributor do not overlap). Recent credit
decays each hour's reward from the hour's start (web.stats.recent_average_credit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from community.models import Membership, Team
from community.selectors import badges_of_teams, team_list
from nodes.models import ONLINE_WINDOW, Node
from nodes.presence import connected_filter
from web.stats import CREDIT_EPOCH, CREDIT_HALF_LIFE, Measures, live_rows, recent_average_credit, snapshot

TEAM_FIGURES_CACHE_SECONDS = 15
TEAM_CURVE_DAYS = 7
TEAM_PAGE_SIZE = 25

# Folded hours per (team, member) inside the member's periods; banned nodes and contributors earn nothing.
_FOLDED_SQL = """
SELECT m.team_id, m.user_id, sum(h.accepted_groups), sum(h.credited_completions), sum(h.verified_reward),
       sum(h.verified_reward * power(2.0, extract(epoch FROM h.hour - %(epoch)s) / %(half_life)s))
FROM community_membership m
JOIN accounts_user u ON u.id = m.user_id AND u.banned_at IS NULL
JOIN nodes_node n ON n.owner_id = m.user_id AND n.banned_at IS NULL
JOIN web_nodehour h ON h.node_id = n.id AND h.hour >= m.joined_at AND (m.left_at IS NULL OR h.hour < m.left_at)
{team_filter}
GROUP BY 1, 2
"""

# The membership periods of the owners of some nodes, still open at `since` (for the live rows).
_PERIODS_SQL = """
SELECT n.id, m.team_id, m.user_id, m.joined_at, m.left_at
FROM nodes_node n
JOIN accounts_user u ON u.id = n.owner_id AND u.banned_at IS NULL
JOIN community_membership m ON m.user_id = n.owner_id AND (m.left_at IS NULL OR m.left_at > %(since)s)
WHERE n.id = ANY(%(nodes)s) AND n.banned_at IS NULL
"""


@dataclass
class TeamCredit:
    """Each team's measures, and each (team, member)'s: what a member earned for that team."""

    by_team: dict[int, Measures] = field(default_factory=dict)
    by_member: dict[tuple[int, int], Measures] = field(default_factory=dict)

    def add(self, team_id: int, user_id: int, m: Measures) -> None:
        self.by_team.setdefault(team_id, Measures()).add(m)
        self.by_member.setdefault((team_id, user_id), Measures()).add(m)


def _hour_growth(reward: float, hour: datetime) -> float:
    return reward * 2.0 ** ((hour - CREDIT_EPOCH).total_seconds() / CREDIT_HALF_LIFE.total_seconds())


def _team_credit(*, team_id: int | None = None, since: datetime | None = None) -> tuple[TeamCredit, dict]:
    """Every team's credit (or one team's), and its live hours: {(team, hour): Measures} for curves.
    `since` also returns the folded hours from then on, in the same snapshot."""
    credit = TeamCredit()
    hours: dict[tuple[int, datetime], Measures] = {}
    params: dict[str, Any] = {"epoch": CREDIT_EPOCH, "half_life": CREDIT_HALF_LIFE.total_seconds(), "team": team_id}
    team_filter = "" if team_id is None else "WHERE m.team_id = %(team)s"
    with snapshot():
        live = live_rows()
        with connection.cursor() as cursor:
            cursor.execute(_FOLDED_SQL.format(team_filter=team_filter), params)
            for team, user, accepted, completions, reward, growth in cursor.fetchall():
                credit.add(team, user, Measures(int(accepted), 0, 0, int(completions), float(reward), float(growth)))
            if since is not None and team_id is not None:
                cursor.execute(
                    """
                    SELECT h.hour, sum(h.accepted_groups), sum(h.credited_completions), sum(h.verified_reward)
                    FROM community_membership m
                    JOIN accounts_user u ON u.id = m.user_id AND u.banned_at IS NULL
                    JOIN nodes_node n ON n.owner_id = m.user_id AND n.banned_at IS NULL
                    JOIN web_nodehour h ON h.node_id = n.id AND h.hour >= m.joined_at
                         AND (m.left_at IS NULL OR h.hour < m.left_at)
                    WHERE m.team_id = %(team)s AND h.hour >= %(since)s
                    GROUP BY 1
                    """,
                    {"team": team_id, "since": since},
                )
                for hour, accepted, completions, reward in cursor.fetchall():
                    hours[(team_id, hour)] = Measures(int(accepted), 0, 0, int(completions), float(reward))
            live_since = (live.since or datetime(1970, 1, 1, tzinfo=UTC)) - timedelta(hours=1)
            node_ids = sorted({node_id for node_id, _ in live.groups.by_node_hour})
            periods: dict[int, list[tuple]] = {}
            if node_ids:
                cursor.execute(_PERIODS_SQL, {"nodes": node_ids, "since": live_since})
                for node_id, team, user, joined_at, left_at in cursor.fetchall():
                    if team_id is None or team == team_id:
                        periods.setdefault(node_id, []).append((team, user, joined_at, left_at))
    for (node_id, hour), m in live.groups.by_node_hour.items():
        for team, user, joined_at, left_at in periods.get(node_id, ()):
            if joined_at <= hour and (left_at is None or hour < left_at):
                counted = Measures(m.accepted, 0, 0, m.completions, m.reward, _hour_growth(m.reward, hour))
                credit.add(team, user, counted)
                if since is not None and hour >= since:
                    hours.setdefault((team, hour), Measures()).add(counted)
    return credit, hours


@dataclass
class TeamFigures:
    team_id: int
    name: str
    slug: str
    members: int
    nodes_online: int = 0
    accepted: int = 0
    completions: int = 0
    verified_reward: float = 0.0
    recent_credit: float = 0.0
    badges: list[str] = field(default_factory=list)
    created_at: datetime | None = None


def _nodes_online_by_team(now: datetime, team_id: int | None = None) -> dict[int, int]:
    """Online nodes of each team's current members, one grouped query."""
    memberships = Membership.objects.filter(left_at__isnull=True)
    if team_id is not None:
        memberships = memberships.filter(team_id=team_id)
    rows = (
        Node.objects.filter(
            connected_filter(now=now), last_seen_at__gte=now - ONLINE_WINDOW, retired_at__isnull=True,
            banned_at__isnull=True, owner__banned_at__isnull=True, owner__team_memberships__in=memberships,
        )
        .values("owner__team_memberships__team_id")
        .annotate(n=Count("id"))
        .order_by()
    )  # fmt: skip
    return {row["owner__team_memberships__team_id"]: row["n"] for row in rows}


def _compute_team_figures(now: datetime) -> list[TeamFigures]:
    credit, _ = _team_credit()
    teams = list(team_list())
    online = _nodes_online_by_team(now)
    badges = badges_of_teams(t.id for t in teams)
    out = []
    for team in teams:
        m = credit.by_team.get(team.id, Measures())
        out.append(
            TeamFigures(
                team_id=team.id, name=team.name, slug=team.slug, members=team.members,
                nodes_online=online.get(team.id, 0), accepted=m.accepted, completions=m.completions,
                verified_reward=m.reward, recent_credit=recent_average_credit(m.growth, now=now),
                badges=badges.get(team.id, []), created_at=team.created_at,
            )
        )  # fmt: skip
    return out


def team_figures_all() -> list[TeamFigures]:
    """Every listed team with its figures (cached TEAM_FIGURES_CACHE_SECONDS)."""
    cached = cache.get("web:team-figures")
    if cached is None:
        cached = _compute_team_figures(timezone.now())
        cache.set("web:team-figures", cached, TEAM_FIGURES_CACHE_SECONDS)
    return cached


TEAM_SORTS = {
    "reward": lambda f: f.verified_reward,
    "recent": lambda f: f.recent_credit,
    "accepted": lambda f: f.accepted,
    "members": lambda f: f.members,
    "online": lambda f: f.nodes_online,
    "name": lambda f: f.name.lower(),
}


def team_rows(*, q: str = "", sort: str = "reward", order: str = "desc") -> tuple[list[TeamFigures], str, bool]:
    """Listed teams sorted (and searched by name); unknown parameters fall back to the defaults."""
    sort = sort if sort in TEAM_SORTS else "reward"
    descending = order != "asc"
    needle = " ".join(str(q or "").split())[:64].lower()
    rows = [f for f in team_figures_all() if needle in f.name.lower()]
    rows.sort(key=lambda f: f.name.lower())
    rows.sort(key=TEAM_SORTS[sort], reverse=descending)
    return rows, sort, descending


def team_page(*, q: str = "", sort: str = "reward", order: str = "desc", page: Any = 1):
    rows, sort, descending = team_rows(q=q, sort=sort, order=order)
    return Paginator(rows, TEAM_PAGE_SIZE).get_page(page), sort, descending, len(rows)


@dataclass
class TeamDetail:
    team: Team
    figures: TeamFigures
    members: list[dict[str, Any]]
    reward_per_hour: float
    curve: list[dict[str, Any]]


def team_detail(*, team: Team, members: list[Membership]) -> TeamDetail:
    """One team's page: its figures, each current member's credit for it, its hourly curve."""
    now = timezone.now()
    start = (now - timedelta(days=TEAM_CURVE_DAYS)).replace(minute=0, second=0, microsecond=0)
    credit, hours = _team_credit(team_id=team.id, since=start)
    m = credit.by_team.get(team.id, Measures())
    figures = TeamFigures(
        team_id=team.id, name=team.name, slug=team.slug, members=len(members),
        nodes_online=_nodes_online_by_team(now, team.id).get(team.id, 0), accepted=m.accepted,
        completions=m.completions, verified_reward=m.reward, recent_credit=recent_average_credit(m.growth, now=now),
        badges=badges_of_teams([team.id]).get(team.id, []),
    )  # fmt: skip
    rows = []
    for membership in members:
        mine = credit.by_member.get((team.id, membership.user_id), Measures())
        rows.append({"user": membership.user, "joined_at": membership.joined_at, "accepted": mine.accepted,
                     "verified_reward": mine.reward, "founder": membership.user_id == team.founder_id})  # fmt: skip
    day_ago = now - timedelta(hours=24)
    last_day = sum(h.reward for (_, hour), h in hours.items() if hour >= day_ago)
    curve = [
        {"hour": hour, "verified_reward": h.reward, "accepted": h.accepted}
        for (_, hour), h in sorted(hours.items(), key=lambda item: item[0][1])
    ]
    return TeamDetail(team, figures, rows, last_day / 24, curve)
