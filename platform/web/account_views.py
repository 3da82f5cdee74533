"""/me/'s account as a whole: download its data as JSON, delete it (web.account)."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth import authenticate, logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from accounts.backends import LOCKED_ATTR
from accounts.passwords import MAX_PASSWORD_LENGTH
from web.account import account_data, account_delete


@never_cache
@login_required
@require_GET
def account_data_view(request: HttpRequest) -> HttpResponse:
    body = json.dumps(account_data(user=request.user), indent=1, ensure_ascii=False)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="sapo-account-{request.user.id}.json"'
    return response


@never_cache
@login_required
@require_POST
def account_delete_view(request: HttpRequest) -> HttpResponse:
    """Deletes the account once its password is given again, checked by the log-in limiter
    (accounts.backends): a session left open is not enough to delete it, nor to guess the password."""
    password = request.POST.get("password", "")[: MAX_PASSWORD_LENGTH + 1]
    user = request.user
    if authenticate(request, username=user.username, password=password) is None:
        if getattr(request, LOCKED_ATTR, 0):
            messages.error(request, "Too many wrong passwords: try again later. Nothing was deleted.")
        else:
            messages.error(request, "That is not your password. Nothing was deleted.")
        return redirect(reverse("web:me") + "#delete-account")
    account_delete(user=user)
    logout(request)
    messages.success(request, "Your account is deleted: its nodes are retired and its name is free.")
    return redirect("/")
