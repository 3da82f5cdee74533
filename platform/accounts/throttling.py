"""REST API throttles (REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]): every API request counts against
its client, per user when signed in ("user" rate) and per address otherwise ("anon" rate).

DRF's own throttles keep a list of timestamps in Django's cache, which is per process here and read
then written (not atomic); these count with accounts.limits, shared by every server process. Rates are
DRF's "N/period" strings, read per request so a changed setting takes effect at once.
"""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from accounts import limits

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """ "120/min" -> (120, 60): requests and window seconds (the period's first letter: s, m, h or d)."""
    count, period = rate.split("/")
    return int(count), _PERIODS[period.strip()[0]]


class _CountedThrottle(BaseThrottle):
    scope = ""
    retry_after = 0

    def ident(self, request: Request) -> str | None:
        raise NotImplementedError

    def allow_request(self, request: Request, view: object) -> bool:
        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        ident = self.ident(request)
        if not rate or ident is None:
            return True
        limit, window = parse_rate(rate)
        count = limits.hit(f"api-{self.scope}", ident, window=window)
        self.retry_after = count.retry_after
        return count.count <= limit

    def wait(self) -> float:
        return self.retry_after


class UserThrottle(_CountedThrottle):
    scope = "user"

    def ident(self, request: Request) -> str | None:
        return str(request.user.pk) if request.user and request.user.is_authenticated else None


class AnonThrottle(_CountedThrottle):
    scope = "anon"

    def ident(self, request: Request) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return limits.client_address(request)
