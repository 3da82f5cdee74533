"""Team pages: /teams/ (list, search, sort, found one) and /teams/<slug>/ (figures, members, actions).
Thin, as web.views: validate -> community service or selector -> figures.teams -> render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.limits import client_address
from common.errors import ApplicationError, NotFound, RateLimited
from community import selectors as community
from community.models import Team
from community.services import (
    team_disband,
    team_edit,
    team_found,
    team_hand_over,
    team_join,
    team_leave,
    team_moderate,
)
from figures import teams
from figures.swarm import aha_groups
from swarms.scope import SITE
from swarms.selectors import SwarmPick, swarm_list, swarm_pick


def _pick_or_404(request: HttpRequest) -> SwarmPick:
    try:
        return swarm_pick(request.GET.get("swarm"))
    except NotFound as exc:
        raise Http404(exc.message) from exc


def _team_or_404(request: HttpRequest, slug: str) -> Team:
    try:
        return community.team_get(slug=slug, viewer=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc


@require_GET
def team_list_view(request: HttpRequest) -> HttpResponse:
    q = request.GET.get("q", "")
    pick = _pick_or_404(request)
    page, sort, descending, total = teams.team_page(
        q=q,
        sort=request.GET.get("sort", "reward"),
        order=request.GET.get("order", "desc"),
        page=request.GET.get("page", 1),
        scope=pick.scope,
    )
    return render(
        request,
        "web/teams.html",
        {
            "page": page,
            "sort": sort,
            "descending": descending,
            "total": total,
            "q": q[:64],
            "swarm": pick.swarm,
            "swarms": swarm_list(),
            "membership": community.membership_current(user=request.user),
        },
    )


@require_GET
def team_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    members = community.team_members(team=team)
    pick = _pick_or_404(request)
    detail = teams.team_detail(team=team, members=members, scope=pick.scope)
    user = request.user
    mine = community.membership_current(user=user)
    return render(
        request,
        "web/team.html",
        {
            "team": team,
            "detail": detail,
            "swarm": pick.swarm,
            "swarms": swarm_list(),
            "membership": mine,
            "is_member": mine is not None and mine.team_id == team.id,
            "is_founder": user.is_authenticated and team.founder_id == user.id,
            "aha": aha_groups(scope=SITE, author_owner_ids=[m.user_id for m in members]),
        },
    )


def _act(request: HttpRequest, action, *, success: str, to: str) -> HttpResponse:
    """Run a team service; a typed error becomes a message on the page it came from, except a limit
    reached: a 429 page that says which limit and when it lets through again."""
    try:
        result = action()
    except RateLimited as exc:
        response = render(request, "429.html", {"message": exc.message, "back": to}, status=429)
        response["Retry-After"] = str(exc.retry_after)
        return response
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect(to)
    messages.success(request, success)
    return redirect(result if isinstance(result, str) else to)


@login_required
@require_POST
def team_found_view(request: HttpRequest) -> HttpResponse:
    def found() -> str:
        team = team_found(
            founder=request.user,
            name=request.POST.get("name", ""),
            description=request.POST.get("description", ""),
            url=request.POST.get("url", ""),
            address=client_address(request),
        )
        return reverse("web:team", args=[team.slug])

    return _act(request, found, success="Team founded. Share its page so others can join.", to=reverse("web:teams"))


@login_required
@require_POST
def team_join_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    here = reverse("web:team", args=[team.slug])
    return _act(request, lambda: team_join(user=request.user, team=team), success=f"You joined {team.name}.", to=here)


@login_required
@require_POST
def team_leave_view(request: HttpRequest) -> HttpResponse:
    return _act(request, lambda: team_leave(user=request.user), success="You left your team.", to=reverse("web:teams"))


@login_required
@require_POST
def team_edit_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    here = reverse("web:team", args=[team.slug])
    return _act(
        request,
        lambda: team_edit(
            actor=request.user,
            team=team,
            name=request.POST.get("name", ""),
            description=request.POST.get("description", ""),
            url=request.POST.get("url", ""),
        ),
        success="Saved.",
        to=here,
    )


@login_required
@require_POST
def team_hand_over_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    here = reverse("web:team", args=[team.slug])
    try:
        to_user_id = community.team_member_user_id(team=team, membership_id=int(request.POST.get("member", "")))
    except ValueError:
        to_user_id = None
    if to_user_id is None:
        messages.error(request, "Choose a member to hand the team over to.")
        return redirect(here)
    return _act(
        request,
        lambda: team_hand_over(actor=request.user, team=team, to_user_id=to_user_id),
        success="Handed over.",
        to=here,
    )


@login_required
@require_POST
def team_disband_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    return _act(
        request,
        lambda: team_disband(actor=request.user, team=team),
        success=f"{team.name} is disbanded.",
        to=reverse("web:teams"),
    )


@login_required
@require_POST
def team_moderate_view(request: HttpRequest, slug: str) -> HttpResponse:
    team = _team_or_404(request, slug)
    here = reverse("web:team", args=[team.slug])
    return _act(
        request,
        lambda: team_moderate(
            actor=request.user,
            team=team,
            action=request.POST.get("action", ""),
            reason=request.POST.get("reason", ""),
            name=request.POST.get("name", ""),
        ),
        success="Done: recorded in the audit log.",
        to=here,
    )
