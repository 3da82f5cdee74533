"""Staff pages of moderation (thin: parse -> service/selector -> render). htmx requests get partials.

Every view is `staff_required`: anonymous visitors go to the login page, signed-in non-staff get 403.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from accounts.models import User
from common.errors import ApplicationError
from common.json_input import JSONInputError, json_loads_bounded
from moderation import selectors, services
from moderation.forms import AuditFilterForm, FilterForm, InvalidFilter, NodeFilterForm, QueueFilterForm, RuleForm
from moderation.rules import RULES
from nodes.models import Node
from nodes.selectors import node_status, node_statuses
from swarms.models import Swarm
from swarms.selectors import swarm_pick

QUEUE_PAGE_SIZE = 20
AUDIT_PAGE_SIZE = 50
NODES_PAGE_SIZE = 50


def staff_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            raise PermissionDenied("Moderation is for staff.")
        return view(request, *args, **kwargs)

    return wrapped


def _page(request: HttpRequest, queryset, size: int):  # noqa: ANN001, ANN202
    return Paginator(queryset, size).get_page(request.GET.get("page"))


def _query_without_page(request: HttpRequest) -> str:
    return urlencode([(k, v) for k, v in request.GET.items() if k != "page"])


def _filtered(form: FilterForm, select: Callable[[dict[str, Any]], Any]) -> tuple[Any, int]:
    """(rows, status) of a page's filter form: an invalid field shows its error and no rows (400), never
    every row as if the field had not been given."""
    try:
        return select(form.filters()), 200
    except InvalidFilter:
        return [], 400


def _back(request: HttpRequest, default: str) -> str:
    """Where a plain (non-htmx) form goes after an action: the page it was sent from when that is a
    page of this site (the Referer header is the client's to write), else `default`."""
    referer = request.META.get("HTTP_REFERER", "")
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return reverse(default)


def _error(request: HttpRequest, exc: ApplicationError) -> HttpResponse:
    response = render(request, "moderation/partials/error.html", {"error": exc}, status=exc.status)
    if request.htmx:  # errors go to the page's alert area, not into the element the form targets
        response["HX-Retarget"] = "#moderation-errors"
        response["HX-Reswap"] = "innerHTML"
    return response


# --- the queue ------------------------------------------------------------------------------------


@require_GET
@staff_required
def queue(request: HttpRequest) -> HttpResponse:
    form = QueueFilterForm(request.GET if request.GET else None)
    rollouts, status = _filtered(form, lambda filters: selectors.rollout_queue(filters=filters))
    context = {
        "form": form,
        "page": _page(request, rollouts, QUEUE_PAGE_SIZE),
        "query": _query_without_page(request),
        "actions": services.ACTIONS,
        "section": "queue",
    }
    return render(request, "moderation/queue.html", context, status=status)


@require_POST
@staff_required
def rollout_action(request: HttpRequest, rollout_id: str) -> HttpResponse:
    try:
        services.rollout_moderate(
            actor=request.user,
            rollout_id=rollout_id,
            action=request.POST.get("action", ""),
            reason=request.POST.get("reason", ""),
        )
    except ApplicationError as exc:
        return _error(request, exc)
    rollout = selectors.rollout_moderation_get(rollout_id=rollout_id)
    if not request.htmx:
        return redirect(_back(request, "moderation:queue"))
    return render(request, "moderation/partials/group.html", {"rollout": rollout, "actions": services.ACTIONS})


def _posted_filters(request: HttpRequest) -> dict[str, Any]:
    """The queue filter a bulk form carries (the same fields as the GET form, posted as `f-<name>`).
    Raises InvalidFilter: a bulk action never runs on a filter that lost a field."""
    data = {name: request.POST.get(f"f-{name}", "") for name in QueueFilterForm.FIELDS}
    data["status"] = data["status"] or "any"
    return QueueFilterForm(data).filters()


@require_POST
@staff_required
def bulk_preview(request: HttpRequest) -> HttpResponse:
    """Step 1 of a bulk action: how many groups the filter matches, and a confirm form."""
    try:
        filters = _posted_filters(request)
    except InvalidFilter as exc:
        return _error(request, exc)
    action = request.POST.get("action", "")
    if action not in services.ACTIONS:
        return _error(request, ApplicationError("invalid_action", "Choose an action."))
    count = selectors.rollout_queue_base(filters=filters).count()
    context = {
        "filters": filters,
        "raw": {k: request.POST.get(f"f-{k}", "") for k in QueueFilterForm.FIELDS},
        "action": action,
        "count": count,
    }
    return render(request, "moderation/partials/bulk_confirm.html", context)


@require_POST
@staff_required
def bulk_apply(request: HttpRequest) -> HttpResponse:
    """Step 2: apply the action to everything the filter matches now (the count is taken again)."""
    try:
        filters = _posted_filters(request)
        count = services.rollouts_moderate_bulk(
            actor=request.user,
            rollouts=selectors.rollout_queue_base(filters=filters),
            action=request.POST.get("action", ""),
            reason=request.POST.get("reason", ""),
            description={k: str(v) for k, v in filters.items()},
        )
    except ApplicationError as exc:
        return _error(request, exc)
    context = {"count": count, "action": request.POST.get("action"), "expected": request.POST.get("expected")}
    response = render(request, "moderation/partials/bulk_done.html", context)
    response["HX-Trigger"] = "moderation:changed"
    return response


# --- nodes and contributors -----------------------------------------------------------------------


@require_GET
@staff_required
def nodes(request: HttpRequest) -> HttpResponse:
    form = NodeFilterForm(request.GET if request.GET else None)
    nodes, status = _filtered(form, lambda filters: selectors.node_moderation_list(filters=filters))
    page = _page(request, nodes, NODES_PAGE_SIZE)
    statuses = node_statuses(page)
    for node in page:
        node.trust_value = selectors.node_trust(node)
        node.status = statuses[node.id]
    return render(
        request,
        "moderation/nodes.html",
        {"form": form, "page": page, "query": _query_without_page(request), "section": "nodes"},
        status=status,
    )


def _node_row(request: HttpRequest, node_id: int) -> HttpResponse:
    node = selectors.node_moderation_list(filters={}).get(id=node_id)
    node.trust_value = selectors.node_trust(node)
    node.status = node_status(node)
    return render(request, "moderation/partials/node_row.html", {"node": node})


@require_POST
@staff_required
def node_action(request: HttpRequest, node_id: int) -> HttpResponse:
    node = get_object_or_404(Node.objects.select_related("owner"), id=node_id)
    action = request.POST.get("action", "")
    reason = request.POST.get("reason", "")
    restore = request.POST.get("restore", "on") == "on"
    try:
        if action == "ban":
            services.node_ban(actor=request.user, node=node, reason=reason)
        elif action == "unban":
            services.node_unban(actor=request.user, node=node, reason=reason, restore_groups=restore)
        elif action == "ban_contributor":
            services.contributor_ban(actor=request.user, user=node.owner, reason=reason)
        elif action == "unban_contributor":
            services.contributor_unban(actor=request.user, user=node.owner, reason=reason, restore_groups=restore)
        else:
            raise ApplicationError("invalid_action", "Unknown action.")
    except ApplicationError as exc:
        return _error(request, exc)
    if not request.htmx:
        return redirect("moderation:nodes")
    return _node_row(request, node.id)


@require_POST
@staff_required
def contributor_action(request: HttpRequest, user_id: int) -> HttpResponse:
    user = get_object_or_404(User, id=user_id)
    reason = request.POST.get("reason", "")
    try:
        if request.POST.get("action") == "ban":
            services.contributor_ban(actor=request.user, user=user, reason=reason)
        elif request.POST.get("action") == "unban":
            services.contributor_unban(
                actor=request.user, user=user, reason=reason, restore_groups=request.POST.get("restore", "on") == "on"
            )
        else:
            raise ApplicationError("invalid_action", "Unknown action.")
    except ApplicationError as exc:
        return _error(request, exc)
    return render(request, "moderation/partials/done.html", {"message": f"{user.username}: done."})


@require_POST
@staff_required
def flag_resolve(request: HttpRequest, flag_id: int) -> HttpResponse:
    try:
        flag = services.flag_resolve(actor=request.user, flag_id=flag_id, reason=request.POST.get("reason", ""))
    except ApplicationError as exc:
        return _error(request, exc)
    if not request.htmx:
        return redirect("moderation:nodes")
    return _node_row(request, flag.node_id)


# --- audit log and rules --------------------------------------------------------------------------


@require_GET
@staff_required
def audit(request: HttpRequest) -> HttpResponse:
    form = AuditFilterForm(request.GET if request.GET else None)
    entries, status = _filtered(form, lambda filters: selectors.audit_list(filters=filters))
    page = _page(request, entries, AUDIT_PAGE_SIZE)
    context = {"form": form, "page": page, "query": _query_without_page(request), "section": "audit"}
    return render(request, "moderation/audit.html", context, status=status)


@require_GET
@staff_required
def rules(request: HttpRequest) -> HttpResponse:
    try:
        pick = swarm_pick(request.GET.get("swarm"))
    except ApplicationError as exc:
        return _error(request, exc)
    items = selectors.rule_list(scope=pick.scope)
    for item in items:
        item["form"] = RuleForm(item["spec"], item["rule"])
    context = {
        "rules": items,
        "swarm": pick.swarm,
        "swarms": Swarm.objects.only("slug", "title", "state"),
        "section": "rules",
    }
    return render(request, "moderation/rules.html", context)


@require_POST
@staff_required
def rule_update(request: HttpRequest, key: str) -> HttpResponse:
    if key not in RULES:
        return _error(request, ApplicationError("unknown_rule", "No such rule.", status=404))
    try:
        pick = swarm_pick(request.POST.get("swarm"))
    except ApplicationError as exc:
        return _error(request, exc)
    spec = RULES[key]
    error = None
    form = None
    if "params" in request.POST:
        # The parameters as one JSON object (scripts, and the API's shape): enabled, action, params.
        enabled = request.POST.get("enabled") == "on"
        action = request.POST.get("action") or spec.action
        try:
            params = json_loads_bounded(request.POST.get("params") or "{}")
        except JSONInputError as exc:
            error = ApplicationError("invalid_rule", f"Parameters: {exc}.")
    else:
        # The page's form: a field per parameter, named with the rule's key as prefix.
        form = RuleForm(spec, data=request.POST)
        if form.is_valid():
            enabled = bool(form.cleaned_data.get("enabled"))
            action = form.cleaned_data.get("action") or spec.action
            params = form.params()
        else:
            error = ApplicationError("invalid_rule", f"Not saved. {form.problems()}.")
    if error is None:
        try:
            services.rule_update(
                actor=request.user, key=key, enabled=enabled, action=action, params=params, scope=pick.scope
            )
        except ApplicationError as exc:
            error = exc
    item = next((i for i in selectors.rule_list(scope=pick.scope) if i["spec"].key == key), None)
    if item is None:  # a key a swarm cannot have: the error above says so
        return _error(request, error or ApplicationError("invalid_rule", "No such rule for a swarm."))
    # After an error the form shows what was typed, with each field's error beside it.
    item["form"] = form if (error is not None and form is not None) else RuleForm(spec, item["rule"])
    status = error.status if error else 200
    if not request.htmx:
        if error is not None:
            return _error(request, error)
        return redirect(
            f"{reverse('moderation:rules')}?{urlencode({'swarm': pick.swarm.slug})}"
            if pick.swarm
            else "moderation:rules"
        )
    context = {"item": item, "swarm": pick.swarm, "error": error, "saved": error is None}
    return render(request, "moderation/partials/rule.html", context, status=status)
