"""Pages of the site (thin: validate -> selector/service -> render). htmx requests get the partial
template of the fragment they swap; the same selectors feed the JSON API (web.api)."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from alerts.selectors import alert_list, alert_settings_get
from alerts.services import alert_secret_rotate, alert_settings_update
from common.errors import ApplicationError, NotFound
from figures import credit, stats
from figures import leaderboard as boards
from figures.swarm import swarm_overview
from moderation.selectors import rollout_inbox_list
from nodes.selectors import access_node, node_activities, node_list
from nodes.services import (
    node_create,
    node_pause_set,
    node_rename,
    node_retire,
    node_token_issue,
    node_token_revoke,
    node_token_rotate,
)
from swarms.scope import SITE
from swarms.selectors import swarm_list, swarm_pick
from web import selectors
from web.install import TOKEN_PLACEHOLDER, TORCH_VERSION, TRANSFORMERS_VERSION, install_machines, install_swarms
from web.wheel import wheel_find, wheel_get


def _site(request: HttpRequest) -> dict[str, str]:
    """Where this site is, for the commands shown to contributors."""
    http = request.build_absolute_uri("/").rstrip("/")
    ws = ("wss://" if request.is_secure() else "ws://") + request.get_host()
    return {"site_url": http, "ws_url": ws + "/ws/node/"}


def _install_context(request: HttpRequest, token: str | None = None) -> dict:
    """The wheel and the commands that install and start the client (web.install), naming the open
    swarm `?swarm=` picks (else the default) and `token` when one was just issued."""
    wheel = wheel_get()
    site = _site(request)
    wheel_url = site["site_url"] + reverse("web:download-file", args=[wheel.build_id, wheel.filename])
    swarms, swarm = install_swarms(chosen=str(request.GET.get("swarm", ""))[:64] or None)
    machines = install_machines(
        wheel_url=wheel_url, ws_url=site["ws_url"], swarm=swarm.slug if swarm else None, token=token
    )
    return {
        **site,
        "wheel": wheel,
        "wheel_url": wheel_url,
        "machines": machines,
        "install_swarms": swarms,
        "install_swarm": swarm,
        "torch_version": TORCH_VERSION,
        "transformers_version": TRANSFORMERS_VERSION,
        "token_placeholder": token or TOKEN_PLACEHOLDER,
        # A token shown once: no control on its page may navigate away from it.
        "install_has_token": bool(token),
    }


# ---------------------------------------------------------------------------- public pages


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    swarm = swarm_overview(scope=SITE)
    return render(request, "web/home.html", {"swarm": swarm})


@require_GET
def download(request: HttpRequest) -> HttpResponse:
    return render(request, "web/download.html", _install_context(request))


@require_GET
def download_file(request: HttpRequest, build_id: str, filename: str) -> HttpResponse:
    wheel = wheel_find(build_id=build_id, filename=filename)
    if wheel is None:
        current = wheel_get()
        if not filename.startswith("sapo_node-"):
            raise Http404("No such file.")
        # An older build, cleaned up since: the current client is what the link was for.
        return redirect("web:download-file", current.build_id, current.filename)
    response = FileResponse(wheel.path.open("rb"), as_attachment=True, filename=wheel.filename)
    response["Content-Type"] = "application/zip"  # a wheel is a zip archive
    response["X-Checksum-Sha256"] = wheel.sha256
    return response


def _leaderboard_context(request: HttpRequest) -> dict:
    try:
        pick = swarm_pick(request.GET.get("swarm"))
    except NotFound as exc:
        raise Http404(exc.message) from exc
    board = boards.leaderboard(
        view=request.GET.get("view", "contributors"),
        sort=request.GET.get("sort", "reward"),
        order=request.GET.get("order", "desc"),
        page=request.GET.get("page", 1),
        scope=pick.scope,
    )
    return {"board": board, "swarm": pick.swarm, "swarms": swarm_list()}


@require_GET
def leaderboard(request: HttpRequest) -> HttpResponse:
    return render(request, "web/leaderboard.html", _leaderboard_context(request))


@require_GET
def leaderboard_table(request: HttpRequest) -> HttpResponse:
    """The table alone: what the page's htmx poll swaps in every few seconds."""
    return render(request, "web/partials/leaderboard_table.html", _leaderboard_context(request))


@require_GET
def leaderboard_how(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "web/leaderboard_how.html",
        {
            "half_life_days": credit.CREDIT_HALF_LIFE.days,
            "fold_lag_minutes": int(stats.FOLD_LAG.total_seconds() // 60),
            "cache_seconds": boards.FIGURES_CACHE_SECONDS,
        },
    )


@require_GET
def swarm(request: HttpRequest) -> HttpResponse:
    """The whole site: every swarm's figures together (each swarm's own page is /swarms/<slug>/)."""
    return render(request, "web/swarm.html", _site_swarm_context())


@require_GET
def swarm_figures(request: HttpRequest) -> HttpResponse:
    return render(request, "web/partials/swarm_figures.html", _site_swarm_context())


def _site_swarm_context() -> dict:
    return {"swarm": swarm_overview(scope=SITE), "figures_url": "/swarm/figures/", "api_url": "/api/v1/swarm/"}


# ---------------------------------------------------------------------------- my nodes


def _me_context(request: HttpRequest) -> dict:
    nodes = list(node_list(owner=request.user))
    figures = boards.node_figures_for(nodes)
    return {
        "nodes": nodes,
        "figures": figures,
        "activities": node_activities(nodes, {node_id: f.status for node_id, f in figures.items()}),
        "reports": selectors.last_reports(nodes=nodes),
        "swarms": selectors.node_swarms(nodes=nodes),
    }


def _me_page(request: HttpRequest, new_token: dict | None = None, new_secret: str | None = None) -> HttpResponse:
    """/me/, with a just-issued token when `new_token` is given.

    The token is rendered straight into the answer to the POST that made it, never kept server side
    (a session would hold the plaintext until the next page, or for good if that page never came);
    the page then rewrites its address to /me/ (site.js, `data-replace-url`) so a reload shows it no
    more. Either way the answer must not be cached: see `never_cache` on the views."""
    context = _me_context(request)
    if new_token:
        context["new_token"] = new_token
        context.update(_install_context(request, token=new_token["token"]))
    context["inbox"] = rollout_inbox_list(owner=request.user)
    context["alert_settings"] = alert_settings_get(user=request.user)
    context["alerts"] = alert_list(user=request.user)
    context["alert_cap"] = settings.SAPO_ALERT_DAILY_CAP
    context["new_secret"] = new_secret  # shown in this answer only, like a token
    context["banned"] = request.user.banned_at is not None
    return render(request, "web/me.html", context)


@never_cache
@login_required
@require_GET
def me(request: HttpRequest) -> HttpResponse:
    return _me_page(request)


@login_required
@require_GET
def me_nodes(request: HttpRequest) -> HttpResponse:
    """The node table alone (polled by htmx, so a node shows up online within seconds)."""
    return render(request, "web/partials/node_table.html", _me_context(request))


@never_cache  # the answer shows the new node's token
@login_required
@require_POST
def node_add(request: HttpRequest) -> HttpResponse:
    try:
        node = node_create(owner=request.user, name=request.POST.get("name", ""))
        _, plaintext = node_token_issue(node=node)
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect("web:me")
    return _me_page(request, {"node_id": node.id, "node_name": node.name, "token": plaintext})


def _access(request: HttpRequest, node_id: int):
    """access_node for pages: someone else's node or none at all is a plain 404 page."""
    try:
        return access_node(request.user, node_id)
    except NotFound as exc:
        raise Http404(exc.message) from exc


def _node_card(request: HttpRequest, node_id: int, **extra) -> HttpResponse:
    node = _access(request, node_id)
    figure = boards.node_figures_for([node])[node.id]
    context = {
        "node": node,
        "figure": figure,
        "activity": node_activities([node], {node.id: figure.status})[node.id],
        "report": selectors.last_reports(nodes=[node]).get(node.id),
        "swarm": selectors.node_swarms(nodes=[node]).get(node.id),
        **extra,
    }
    if extra.get("token"):
        context.update(_install_context(request, token=extra["token"]))
    return render(request, "web/partials/node_card.html", context)


def _node_action(request: HttpRequest, node_id: int, action) -> HttpResponse:
    """Run `action(node)`; answer the refreshed card (htmx) or go back to /me/ (plain form)."""
    node = _access(request, node_id)
    extra = {}
    try:
        extra = action(node) or {}
    except ApplicationError as exc:
        extra = {"error": exc.message}
        if not request.htmx:
            messages.error(request, exc.message)
    if not request.htmx:
        if extra.get("token"):  # shown in this answer only (see _me_page)
            return _me_page(request, {"node_id": node.id, "node_name": node.name, "token": extra["token"]})
        return redirect(reverse("web:me") + f"#node-{node.id}")
    return _node_card(request, node.id, **extra)


@never_cache
@login_required
@require_POST
def node_rename_view(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_action(
        request,
        node_id,
        lambda node: node_rename(node=node, name=request.POST.get("name", "")) and {"notice": "Renamed."},
    )


@never_cache
@login_required
@require_POST
def node_rotate_view(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_action(request, node_id, lambda node: {"token": node_token_rotate(node=node)})


@never_cache
@login_required
@require_POST
def node_revoke_view(request: HttpRequest, node_id: int) -> HttpResponse:
    def revoke(node):
        count = node_token_revoke(node=node)
        return {"notice": f"Revoked {count} token{'s' if count != 1 else ''}. The node is disconnected."}

    return _node_action(request, node_id, revoke)


@never_cache
@login_required
@require_POST
def node_retire_view(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_action(
        request, node_id, lambda node: node_retire(node=node) and {"notice": "Retired: its history is kept."}
    )


@never_cache
@login_required
@require_POST
def node_pause_view(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_action(
        request,
        node_id,
        lambda node: (
            node_pause_set(node=node, paused=True)
            and {"notice": "Paused: the node finishes its step and waits, keeping what it holds."}
        ),
    )


@never_cache
@login_required
@require_POST
def node_resume_view(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_action(
        request, node_id, lambda node: node_pause_set(node=node, paused=False) and {"notice": "Resumed."}
    )


@login_required
@require_GET
def node_card(request: HttpRequest, node_id: int) -> HttpResponse:
    return _node_card(request, node_id)


# ---------------------------------------------------------------------------- alerts


def _form_number(request: HttpRequest, name: str, kind: type, default: float) -> float:
    text = request.POST.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError as exc:
        raise ApplicationError("invalid_number", f"{name.replace('_', ' ').capitalize()} must be a number.") from exc


@never_cache  # the answer may show the new webhook secret
@login_required
@require_POST
def alerts_save(request: HttpRequest) -> HttpResponse:
    try:
        row, new_secret = alert_settings_update(
            user=request.user,
            email_alerts=request.POST.get("email_alerts") == "on",
            webhook_url=request.POST.get("webhook_url", "")[:1000],
            silence_minutes=int(_form_number(request, "silence_minutes", int, 30)),
            min_acceptance=_form_number(request, "min_acceptance", float, 50.0) / 100.0,
        )
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect(reverse("web:me") + "#alerts")
    if row.email_alerts and request.user.email_confirmed_at is None:
        messages.warning(request, "Email alerts wait for a confirmed address: set and confirm it under Account.")
    if new_secret:
        return _me_page(request, new_secret=new_secret)
    messages.success(request, "Alert settings saved.")
    return redirect(reverse("web:me") + "#alerts")


@never_cache
@login_required
@require_POST
def alerts_secret_rotate(request: HttpRequest) -> HttpResponse:
    try:
        secret = alert_secret_rotate(user=request.user)
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return redirect(reverse("web:me") + "#alerts")
    return _me_page(request, new_secret=secret)


# ---------------------------------------------------------------------------- errors


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "400.html", status=400)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "403.html", status=403)


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return render(request, "404.html", {"request_path": request.path}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    # No context processors beyond the request: the failure may lie in any of them.
    from django.template import loader

    return HttpResponse(loader.get_template("500.html").render({}), status=500)
