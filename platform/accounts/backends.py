"""The one authentication backend (settings.AUTHENTICATION_BACKENDS): Django's ModelBackend behind the
log-in limiter, so the site's log-in page, the admin's and any other `authenticate()` call share it.

Failed attempts are counted per username and per client address (accounts.limits). Once either reaches
its limit (SAPO_LOGIN_FAILURES_PER_USER / _PER_ADDRESS in SAPO_LOGIN_WINDOW_SECONDS), every attempt on
it fails until the window closes, the right password included: otherwise a guesser would learn the
password the moment it worked. A success clears the username's count, not the address's (an attacker
holding one account must not reset the address counter with it).

The price is that anyone can lock an account for one window by failing on purpose; the window is short
and the lock never outlives it.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from accounts import limits
from accounts.passwords import MAX_PASSWORD_LENGTH

#: Set on the request while a lock refuses the attempt: seconds until it lifts (read by accounts.forms).
LOCKED_ATTR = "sapo_login_locked_for"


def _counters(request: HttpRequest | None, username: str) -> list[tuple[str, str, int]]:
    """(counter name, ident, limit) of the counters an attempt is checked against."""
    counters = [("login-user", username.strip().lower(), settings.SAPO_LOGIN_FAILURES_PER_USER)]
    if request is not None:  # test clients and scripts call authenticate() without one
        counters.append(("login-address", limits.client_address(request), settings.SAPO_LOGIN_FAILURES_PER_ADDRESS))
    return counters


def login_locked_for(request: HttpRequest | None, username: str) -> int:
    """Seconds until a log-in as `username` from this client may be tried again; 0: it may now."""
    waits = []
    for name, ident, limit in _counters(request, username):
        count = limits.peek(name, ident)
        if count.count >= limit:
            waits.append(count.retry_after)
    return max(waits, default=0)


class LimitedModelBackend(ModelBackend):
    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> AbstractBaseUser | None:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        locked_for = login_locked_for(request, username)
        if locked_for:
            if request is not None:
                setattr(request, LOCKED_ATTR, locked_for)
            # PermissionDenied: authenticate() stops here (no later backend is asked) and returns None.
            raise PermissionDenied("too many failed log-ins")
        # A password no account can have is a failure without hashing it (accounts.passwords).
        too_long = len(password) > MAX_PASSWORD_LENGTH
        user = None if too_long else super().authenticate(request, username=username, password=password, **kwargs)
        window = settings.SAPO_LOGIN_WINDOW_SECONDS
        counters = _counters(request, username)
        if user is None:
            for name, ident, _ in counters:
                limits.hit(name, ident, window=window)
        else:
            name, ident, _ = counters[0]
            limits.clear(name, ident)
        return user
