"""The swarms' pages: `/swarms/` (every swarm of the site), `/swarms/<slug>/` (one swarm's status,
the figures of `/swarm/` filtered to it), and the staff pages that open, edit, pause and retire them
(swarms.services: validated and audited). Retired swarms keep their pages."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from common.errors import ApplicationError, NotFound
from common.json_input import JSONInputError, json_loads_bounded
from figures.heldout import MIN_ANSWERS
from figures.swarm import swarm_heldout, swarm_overview
from moderation.views import staff_required
from swarms.scope import Scope
from swarms.selectors import swarm_catalogue, swarm_get, swarm_list
from swarms.services import swarm_catalogue_set, swarm_create, swarm_make_default, swarm_state_set, swarm_update

#: The fields of the staff form, as swarms.services takes them.
_FORM_FIELDS = (
    "title",
    "description",
    "recommended_models",
    "default_local",
    "default_external",
    "sample_window_seconds",
    "max_stored_bytes_per_node_hour",
)


def _swarm(slug: str) -> Any:
    try:
        return swarm_get(slug=slug)
    except NotFound as exc:
        raise Http404(exc.message) from exc


def swarms_with_figures() -> list[tuple[Any, dict[str, Any]]]:
    """Every swarm (open first, retired last) with its figures (each cached a few seconds)."""
    order = {"open": 0, "paused": 1, "retired": 2}
    swarms = sorted(swarm_list(), key=lambda s: (order.get(s.state, 3), not s.is_default, s.slug))
    return [(s, swarm_overview(scope=Scope.swarm(s.id))) for s in swarms]


@require_GET
def swarm_list_view(request: HttpRequest) -> HttpResponse:
    return render(request, "web/swarms.html", {"swarms": swarms_with_figures()})


def _page_context(swarm: Any) -> dict[str, Any]:
    return {
        "swarm": swarm_overview(scope=Scope.swarm(swarm.id)),
        "swarm_obj": swarm,
        "heldout": swarm_heldout(swarm=swarm),
        "min_answers": MIN_ANSWERS,
        "figures_url": reverse("web:swarm-one-figures", args=[swarm.slug]),
        "api_url": reverse("web:api-swarm-one", args=[swarm.slug]),
    }


@require_GET
def swarm_view(request: HttpRequest, slug: str) -> HttpResponse:
    swarm = _swarm(slug)
    catalogue = swarm_catalogue(swarm=swarm)
    return render(request, "web/swarm.html", {**_page_context(swarm), "catalogue": catalogue})


@require_GET
def swarm_figures_view(request: HttpRequest, slug: str) -> HttpResponse:
    return render(request, "web/partials/swarm_figures.html", _page_context(_swarm(slug)))


# --- staff ----------------------------------------------------------------------------------------


def _form_fields(request: HttpRequest) -> dict[str, Any]:
    return {name: request.POST.get(name, "") for name in _FORM_FIELDS if name in request.POST}


def _entries(text: str) -> Any:
    try:
        return json_loads_bounded(text or "")
    except JSONInputError as exc:
        raise ApplicationError("invalid_catalogue", f"entries: {exc}", extra={"field": "entries"}) from None


def _manage_page(request: HttpRequest, swarm: Any | None, error: ApplicationError | None = None) -> HttpResponse:
    entries = swarm_catalogue(swarm=swarm).entries if swarm is not None else []
    context = {
        "swarm_obj": swarm,
        "entries_json": request.POST.get("entries") or json.dumps(entries, indent=1),
        "posted": request.POST if error is not None else None,
        "error": error,
        "states": ["open", "paused", "retired"],
    }
    return render(request, "web/swarm_manage.html", context, status=error.status if error else 200)


@require_http_methods(["GET", "POST"])
@staff_required
def swarm_new_view(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _manage_page(request, None)
    try:
        swarm = swarm_create(
            actor=request.user,
            slug=request.POST.get("slug", ""),
            entries=_entries(request.POST.get("entries", "")),
            reason=request.POST.get("reason", ""),
            **_form_fields(request),
        )
    except ApplicationError as exc:
        return _manage_page(request, None, exc)
    messages.success(request, f"Swarm {swarm.slug} is open.")
    return redirect("web:swarm-manage", slug=swarm.slug)


@require_http_methods(["GET", "POST"])
@staff_required
def swarm_manage_view(request: HttpRequest, slug: str) -> HttpResponse:
    swarm = _swarm(slug)
    if request.method == "GET":
        return _manage_page(request, swarm)
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")
    try:
        if action == "edit":
            swarm_update(actor=request.user, swarm=swarm, reason=reason, **_form_fields(request))
        elif action == "catalogue":
            swarm_catalogue_set(
                actor=request.user, swarm=swarm, entries=_entries(request.POST.get("entries", "")), reason=reason
            )
        elif action == "state":
            swarm_state_set(actor=request.user, swarm=swarm, state=request.POST.get("state", ""), reason=reason)
        elif action == "default":
            swarm_make_default(actor=request.user, swarm=swarm, reason=reason)
        else:
            raise ApplicationError("invalid_action", f"Unknown action {action[:40]!r}.")
    except ApplicationError as exc:
        return _manage_page(request, swarm, exc)
    messages.success(request, "Saved.")
    return redirect("web:swarm-manage", slug=swarm.slug)
