"""Public pages of contributors and nodes, and the switch that makes a profile private (/me/)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from accounts.services import profile_set_private
from common.errors import NotFound
from figures import profiles
from figures.swarm import node_heldout_curve
from nodes.selectors import node_activity
from web import selectors


@require_GET
def contributor_view(request: HttpRequest, username: str) -> HttpResponse:
    try:
        owner = profiles.contributor_public_get(username=username, viewer=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    return render(request, "web/contributor.html", {"profile": profiles.contributor_profile(owner=owner)})


@require_GET
def node_view(request: HttpRequest, node_id: int) -> HttpResponse:
    try:
        node = profiles.node_public_get(node_id=node_id, viewer=request.user)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    profile = profiles.node_profile(node=node)
    status = next((f.status for f in profile.nodes if f.node_id == node.id), "")
    context = {
        "node": node,
        "profile": profile,
        "swarm": selectors.node_swarms(nodes=[node]).get(node.id),
        "activity": node_activity(node, status=status),
        "node_heldout": node_heldout_curve(node=node),
    }
    return render(request, "web/node.html", context)


@login_required
@require_POST
def privacy_view(request: HttpRequest) -> HttpResponse:
    private = request.POST.get("private") == "on"
    profile_set_private(user=request.user, private=private)
    messages.success(
        request,
        "Your profile is private: others see “anonymous” and your pages are not found."
        if private
        else "Your profile is public.",
    )
    return redirect(reverse("web:me") + "#profile")
