"""Reads of teams, memberships and badges (the figures themselves are figures.teams')."""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Count, Q, QuerySet

from accounts.models import User
from common.errors import NotFound
from community.models import Badge, Membership, Team
from swarms.scope import Scope

TEAM_SEARCH_MAX_LENGTH = 64


def team_list(*, q: str = "") -> QuerySet[Team]:
    """Listed teams (neither hidden nor disbanded, and their founder not banned: a banned founder's team
    is unlisted until staff lift the ban), with `members` (current) annotated; `q` searches names."""
    queryset = Team.objects.filter(
        hidden_at__isnull=True, disbanded_at__isnull=True, founder__banned_at__isnull=True
    ).annotate(members=Count("memberships", filter=Q(memberships__left_at__isnull=True)))
    q = " ".join(str(q or "").split())[:TEAM_SEARCH_MAX_LENGTH]
    if q:
        queryset = queryset.filter(name__icontains=q)
    return queryset.order_by("name")


def team_get(*, slug: str, viewer: User | None = None) -> Team:
    """The team at /teams/<slug>/ as `viewer` may see it: a disbanded team is gone, a hidden one is
    seen by staff and its own members only, and so is one whose founder is banned. Raises NotFound."""
    team = Team.objects.select_related("founder").filter(slug=slug, disbanded_at__isnull=True).first()
    if team is None:
        raise NotFound("No such team.")
    if team.hidden_at is not None or team.founder.banned_at is not None:
        authenticated = viewer is not None and viewer.is_authenticated
        if not authenticated or not (
            viewer.is_staff or Membership.objects.filter(team=team, user=viewer, left_at__isnull=True).exists()
        ):
            raise NotFound("No such team.")
    return team


def team_members(*, team: Team) -> list[Membership]:
    """Current members, longest-standing first."""
    return list(
        Membership.objects.filter(team=team, left_at__isnull=True).select_related("user").order_by("joined_at", "id")
    )


def team_member_user_id(*, team: Team, membership_id: int) -> int | None:
    """The account of a current member of `team`, named by their membership (the hand-over form names
    members so, not by account id, which a private member's page would not reveal)."""
    return (
        Membership.objects.filter(id=membership_id, team=team, left_at__isnull=True)
        .values_list("user_id", flat=True)
        .first()
    )


def membership_current(*, user: User) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.select_related("team").filter(user=user, left_at__isnull=True).first()


def current_teams_of(user_ids: Iterable[int]) -> dict[int, Team]:
    """Each contributor's current listed team (those in none, or in a hidden one, are left out)."""
    rows = Membership.objects.filter(
        user_id__in=list(user_ids),
        left_at__isnull=True,
        team__hidden_at__isnull=True,
        team__founder__banned_at__isnull=True,
    ).select_related("team")
    return {m.user_id: m.team for m in rows}


def _badges_in(scope: Scope) -> QuerySet[Badge]:
    """The badges held in `scope`: the site's own (their swarm column empty), or those earned in one swarm."""
    Scope.check(scope)
    return Badge.objects.filter(swarm__isnull=True) if scope.is_site else Badge.objects.filter(swarm_id=scope.swarm_id)


def badges_of_users(user_ids: Iterable[int], *, scope: Scope) -> dict[int, list[str]]:
    """Each contributor's badges of the whole site, or the rank badges earned in one swarm (`scope`)."""
    out: dict[int, list[str]] = {}
    rows = _badges_in(scope).filter(user_id__in=list(user_ids))
    for user_id, kind in rows.values_list("user_id", "kind"):
        out.setdefault(user_id, []).append(kind)
    return out


def badges_of_teams(team_ids: Iterable[int], *, scope: Scope) -> dict[int, list[str]]:
    """Each team's badges of the whole site, or the rank badges earned in one swarm (`scope`)."""
    out: dict[int, list[str]] = {}
    rows = _badges_in(scope).filter(team_id__in=list(team_ids))
    for team_id, kind in rows.values_list("team_id", "kind"):
        out.setdefault(team_id, []).append(kind)
    return out
