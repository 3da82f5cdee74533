"""Team figures: what members earned while members, from the folded per-hour table (NodeHour) plus
the live rows the fold has not counted yet, read in one snapshot (figures.stats). docs/community.md#teams.

A membership period [joined_at, left_at) counts, for each of the member's nodes:
- the whole hours from the hour of joining up to (not including) the hour of leaving, from the hour
  tables (folded hours and live rows alike);
- minus the groups of the hour of joining created before joining, plus those of the hour of leaving
  created before leaving: both read from the pool itself, at most an hour of the member's nodes each,
  through its (node, created_at) index.
So the count is exact to the group: joining brings no past credit, leaving takes none away, and no
group counts for two teams (one contributor's periods never overlap). Recent credit decays each
group's reward from the start of its hour, as the hour tables do.
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
from psycopg import sql

from community.models import Membership, Team
from community.selectors import badges_of_teams, team_list
from figures import credit as rule
from figures.stats import Measures, live_rows, snapshot
from nodes.models import Node
from nodes.presence import PresenceUnknown, connected_filter
from swarms.scope import Scope

TEAM_FIGURES_CACHE_SECONDS = 15
TEAM_CURVE_DAYS = 7
TEAM_PAGE_SIZE = 25

# The members' nodes of each period; banned nodes and contributors earn their team nothing.
_PERIOD_NODES = sql.SQL("""
FROM community_membership m
JOIN accounts_user u ON u.id = m.user_id AND u.banned_at IS NULL
JOIN nodes_node n ON n.owner_id = m.user_id AND n.banned_at IS NULL
""")


def _hours_sql(team_filter: sql.Composable, scope: Scope) -> sql.Composed:
    """Folded whole hours of each period, per hour from `since` (the curve) and in one sum before it;
    of every swarm (figures_nodehour) or of one (figures_nodeswarmhour, the same rows narrowed to it).
    Each hour's reward decays from the start of the hour."""
    if scope.is_site:
        hours, swarm_filter = sql.Identifier("figures_nodehour"), sql.SQL("")
    else:
        hours, swarm_filter = sql.Identifier("figures_nodeswarmhour"), sql.SQL("AND h.swarm_id = %(swarm)s")
    return sql.SQL("""
SELECT m.id, m.team_id, m.user_id, CASE WHEN h.hour >= %(since)s THEN h.hour END AS hour,
       sum(h.accepted_groups), sum(h.credited_completions), sum(h.verified_reward), sum({growth})
{period_nodes}
JOIN {hours} h ON h.node_id = n.id {swarm_filter} AND h.hour >= date_trunc('hour', m.joined_at)
     AND (m.left_at IS NULL OR h.hour < date_trunc('hour', m.left_at))
WHERE {team_filter}
GROUP BY 1, 2, 3, 4
""").format(
        growth=rule.growth(sql.SQL("h.verified_reward"), sql.SQL("h.hour")),
        period_nodes=_PERIOD_NODES,
        hours=hours,
        swarm_filter=swarm_filter,
        team_filter=team_filter,
    )


def _parts_sql(team_filter: sql.Composable, scope: Scope) -> sql.Composed:
    """The groups of the hour of joining before joining (sign -1) and of the hour of leaving before
    leaving (sign +1), from the pool, with the fold's figures (figures.credit); of one swarm or all."""
    swarm_filter = sql.SQL("") if scope.is_site else sql.SQL("AND r.swarm_id = %(swarm)s")
    return sql.SQL("""
SELECT m.id, m.team_id, m.user_id, p.sign, p.lo, {measures}
{period_nodes}
CROSS JOIN LATERAL (VALUES (-1, date_trunc('hour', m.joined_at), m.joined_at),
                           (1, date_trunc('hour', m.left_at), m.left_at)) AS p(sign, lo, hi)
JOIN pool_rollout r ON r.node_id = n.id AND r.created_at >= p.lo AND r.created_at < p.hi {swarm_filter}
{lateral}
WHERE p.hi IS NOT NULL AND {team_filter}
GROUP BY 1, 2, 3, 4, 5
""").format(
        measures=rule.measures(["accepted", "completions", "reward"]),
        period_nodes=_PERIOD_NODES,
        lateral=rule.credit_lateral(),
        swarm_filter=swarm_filter,
        team_filter=team_filter,
    )


# The periods of the owners of some nodes that may cover hours of the live rows.
_PERIODS_SQL = """
SELECT n.id, m.team_id, m.user_id, m.joined_at, m.left_at
FROM nodes_node n
JOIN accounts_user u ON u.id = n.owner_id AND u.banned_at IS NULL
JOIN community_membership m ON m.user_id = n.owner_id AND (m.left_at IS NULL OR m.left_at > %(since)s)
WHERE n.id = ANY(%(nodes)s) AND n.banned_at IS NULL
"""

_FAR_PAST = datetime(1970, 1, 1, tzinfo=UTC)


def _hour_of(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


@dataclass
class TeamCredit:
    """Each team's measures, each (team, member)'s (what a member earned for that team), and the
    per-hour measures of the curve (hours from `since` only)."""

    by_team: dict[int, Measures] = field(default_factory=dict)
    by_member: dict[tuple[int, int], Measures] = field(default_factory=dict)
    hours: dict[tuple[int, datetime], Measures] = field(default_factory=dict)

    def add(self, team_id: int, user_id: int, m: Measures, hour: datetime | None = None) -> None:
        self.by_team.setdefault(team_id, Measures()).add(m)
        self.by_member.setdefault((team_id, user_id), Measures()).add(m)
        if hour is not None:
            self.hours.setdefault((team_id, hour), Measures()).add(m)


def _team_credit(*, scope: Scope, team_id: int | None = None, since: datetime | None = None) -> TeamCredit:
    """Every team's credit (or one team's), in `scope`; with `since`, its hours from then on (the
    curve)."""
    credit = TeamCredit()
    since = since or datetime(9999, 1, 1, tzinfo=UTC)
    params: dict[str, Any] = {"team": team_id, "since": since, "swarm": None if scope.is_site else scope.swarm_id}
    one_team = team_id is not None
    team_filter = sql.SQL("m.team_id = %(team)s") if one_team else sql.SQL("TRUE")
    with snapshot():
        live = live_rows()
        with connection.cursor() as cursor:
            cursor.execute(_hours_sql(team_filter, scope), params)
            for _, team, user, hour, accepted, completions, reward, growth in cursor.fetchall():
                m = Measures(int(accepted), 0, 0, int(completions), float(reward), float(growth))
                credit.add(team, user, m, hour)
            cursor.execute(_parts_sql(team_filter, scope), params)
            for _, team, user, sign, hour, accepted, completions, reward in cursor.fetchall():
                m = Measures(
                    sign * int(accepted),
                    0,
                    0,
                    sign * int(completions),
                    sign * float(reward),
                    sign * rule.growth_of(float(reward), hour),
                )
                credit.add(team, user, m, hour if hour >= since else None)
            live_since = _hour_of(live.since or _FAR_PAST)
            if scope.is_site:
                live_hours = live.groups.by_node_hour
            else:
                live_hours = {
                    (n, h): m for (n, s, h), m in live.groups.by_node_swarm_hour.items() if s == scope.swarm_id
                }
            node_ids = sorted({node_id for node_id, _ in live_hours})
            periods: dict[int, list[tuple]] = {}
            if node_ids:
                cursor.execute(_PERIODS_SQL, {"nodes": node_ids, "since": live_since})
                for node_id, team, user, joined_at, left_at in cursor.fetchall():
                    if not one_team or team == team_id:
                        periods.setdefault(node_id, []).append((team, user, joined_at, left_at))
    for (node_id, hour), m in live_hours.items():
        for team, user, joined_at, left_at in periods.get(node_id, ()):
            if _hour_of(joined_at) <= hour and (left_at is None or hour < _hour_of(left_at)):
                counted = Measures(m.accepted, 0, 0, m.completions, m.reward, rule.growth_of(m.reward, hour))
                credit.add(team, user, counted, hour if hour >= since else None)
    return credit


@dataclass
class TeamFigures:
    team_id: int
    name: str
    slug: str
    members: int
    nodes_online: int | None = 0  # None: unknown (presence cannot be read now)
    accepted: int = 0
    completions: int = 0
    verified_reward: float = 0.0
    recent_credit: float = 0.0
    badges: list[str] = field(default_factory=list)
    created_at: datetime | None = None


def _nodes_online_by_team(now: datetime, team_id: int | None = None, *, scope: Scope) -> dict[int, int] | None:
    """Online nodes of each team's current members (with a socket in `scope`), one grouped query; None
    when presence is unknown."""
    try:
        connected = connected_filter(now=now, scope=scope)
    except PresenceUnknown:
        return None
    memberships = Membership.objects.filter(left_at__isnull=True)
    if team_id is not None:
        memberships = memberships.filter(team_id=team_id)
    rows = (
        Node.objects.filter(
            connected,
            retired_at__isnull=True,
            banned_at__isnull=True,
            owner__banned_at__isnull=True,
            owner__team_memberships__in=memberships,
        )
        .values("owner__team_memberships__team_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {row["owner__team_memberships__team_id"]: row["n"] for row in rows}


def _credit_and_online(scope: Scope) -> tuple[dict[int, Measures], dict[int, int] | None]:
    """Each team's measures (in `scope`) and nodes online: the costly part, cached
    TEAM_FIGURES_CACHE_SECONDS."""
    key = "figures:team-credit" if scope.is_site else f"figures:team-credit:swarm:{scope.swarm_id}"
    cached = cache.get(key)
    if cached is None:
        credit = _team_credit(scope=scope)
        cached = (credit.by_team, _nodes_online_by_team(timezone.now(), scope=scope))
        cache.set(key, cached, TEAM_FIGURES_CACHE_SECONDS)
    return cached


def team_figures_all(*, scope: Scope) -> list[TeamFigures]:
    """Every listed team with its figures in `scope` (nodes online: those with a socket in it). The
    list, names, members and badges are read on every call (a team founded, renamed, hidden or joined
    shows at once); credit and nodes online are cached."""
    Scope.check(scope)
    now = timezone.now()
    credit, online = _credit_and_online(scope)
    teams = list(team_list())
    badges = badges_of_teams((t.id for t in teams), scope=scope)
    out = []
    for team in teams:
        m = credit.get(team.id, Measures())
        out.append(
            TeamFigures(
                team_id=team.id,
                name=team.name,
                slug=team.slug,
                members=team.members,
                nodes_online=None if online is None else online.get(team.id, 0),
                accepted=m.accepted,
                completions=m.completions,
                verified_reward=m.reward,
                recent_credit=rule.recent_average_credit(m.growth, now=now),
                badges=badges.get(team.id, []),
                created_at=team.created_at,
            )
        )
    return out


TEAM_SORTS = {
    "reward": lambda f: f.verified_reward,
    "recent": lambda f: f.recent_credit,
    "accepted": lambda f: f.accepted,
    "members": lambda f: f.members,
    "online": lambda f: f.nodes_online or 0,
    "name": lambda f: f.name.lower(),
}


def team_rows(
    *, q: str = "", sort: str = "reward", order: str = "desc", scope: Scope
) -> tuple[list[TeamFigures], str, bool]:
    """Listed teams sorted (and searched by name), with their figures in `scope`; unknown parameters
    fall back to the defaults."""
    sort = sort if sort in TEAM_SORTS else "reward"
    descending = order != "asc"
    needle = " ".join(str(q or "").split())[:64].lower()
    rows = [f for f in team_figures_all(scope=scope) if needle in f.name.lower()]
    rows.sort(key=lambda f: f.name.lower())
    rows.sort(key=TEAM_SORTS[sort], reverse=descending)
    return rows, sort, descending


def team_page(*, q: str = "", sort: str = "reward", order: str = "desc", page: Any = 1, scope: Scope):
    rows, sort, descending = team_rows(q=q, sort=sort, order=order, scope=scope)
    return Paginator(rows, TEAM_PAGE_SIZE).get_page(page), sort, descending, len(rows)


def _team_credit_cached(*, team_id: int, since: datetime, scope: Scope) -> TeamCredit:
    """One team's credit and curve, cached TEAM_FIGURES_CACHE_SECONDS as the list's: each membership
    period costs two pool scans (the hours of joining and leaving), so a team of thousands of periods
    is computed once per interval, not at every view (docs/community.md#teams)."""
    key = f"figures:team-credit:{team_id}:{since:%Y%m%d%H}:{'' if scope.is_site else scope.swarm_id}"
    credit = cache.get(key)
    if credit is None:
        credit = _team_credit(scope=scope, team_id=team_id, since=since)
        cache.set(key, credit, TEAM_FIGURES_CACHE_SECONDS)
    return credit


@dataclass
class TeamDetail:
    team: Team
    figures: TeamFigures
    members: list[dict[str, Any]]
    reward_per_hour: float
    curve: list[dict[str, Any]]


def team_detail(*, team: Team, members: list[Membership], scope: Scope) -> TeamDetail:
    """One team's page: its figures, each current member's credit for it, its hourly curve; in the whole
    site (`Scope.site()`) or in one swarm."""
    Scope.check(scope)
    now = timezone.now()
    start = (now - timedelta(days=TEAM_CURVE_DAYS)).replace(minute=0, second=0, microsecond=0)
    credit = _team_credit_cached(team_id=team.id, since=start, scope=scope)
    hours = credit.hours
    m = credit.by_team.get(team.id, Measures())
    figures = TeamFigures(
        team_id=team.id,
        name=team.name,
        slug=team.slug,
        members=len(members),
        nodes_online=None
        if (online := _nodes_online_by_team(now, team.id, scope=scope)) is None
        else online.get(team.id, 0),
        accepted=m.accepted,
        completions=m.completions,
        verified_reward=m.reward,
        recent_credit=rule.recent_average_credit(m.growth, now=now),
        badges=badges_of_teams([team.id], scope=scope).get(team.id, []),
    )
    rows = []
    for membership in members:
        mine = credit.by_member.get((team.id, membership.user_id), Measures())
        rows.append(
            {
                "user": membership.user,
                "membership_id": membership.id,  # what the hand-over form names a member by: no account id
                "joined_at": membership.joined_at,
                "accepted": mine.accepted,
                "verified_reward": mine.reward,
                "founder": membership.user_id == team.founder_id,
            }
        )
    day_ago = now - timedelta(hours=24)
    last_day = sum(h.reward for (_, hour), h in hours.items() if hour >= day_ago)
    curve = [
        {"hour": hour, "verified_reward": h.reward, "accepted": h.accepted}
        for (_, hour), h in sorted(hours.items(), key=lambda item: item[0][1])
    ]
    return TeamDetail(team, figures, rows, last_day / 24, curve)
