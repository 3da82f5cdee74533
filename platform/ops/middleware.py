"""The Content-Security-Policy header (Django 5.2 has none built in).

The site's pages load scripts and styles from the site itself only, with no inline script, style
or `eval` (htmx is configured without them in base.html), so the default policy in settings.py
forbids all three; a page that needs more breaks visibly in the browser tests (tests/browser).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

HEADER = "Content-Security-Policy"


class ContentSecurityPolicyMiddleware(MiddlewareMixin):
    """Adds settings.CONTENT_SECURITY_POLICY (unless empty, DEBUG is on, or the view set its own). MiddlewareMixin,
    as Django's SecurityMiddleware: it runs in sync and async chains alike."""

    def process_response(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        # DEBUG is read per response: the test run turns it off after settings are imported.
        if settings.CONTENT_SECURITY_POLICY and not settings.DEBUG and HEADER not in response:
            response[HEADER] = settings.CONTENT_SECURITY_POLICY
        return response
