"""Typed application errors and the one DRF exception handler that renders them.

Services raise `ApplicationError(code, message)`; entry points turn it into a response:
DRF views through `drf_exception_handler` (JSON `{"code", "detail", ...extra}`), consumers
through their own helper (an `error` frame or a close code).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_default_handler


class ApplicationError(Exception):
    """A failure the caller can act on, identified by a stable machine-readable `code`.

    `status` is the HTTP status an API view answers with; `extra` is merged into the JSON body.
    """

    def __init__(self, code: str, message: str, status: int = 400, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.extra = dict(extra or {})

    def __repr__(self) -> str:
        return f"ApplicationError(code={self.code!r}, message={self.message!r}, status={self.status})"

    def as_dict(self) -> dict[str, Any]:
        return {**self.extra, "code": self.code, "detail": self.message}


class NotFound(ApplicationError):
    """The object does not exist, or the caller may not know that it does (same answer on purpose)."""

    def __init__(self, message: str = "Not found.", code: str = "not_found") -> None:
        super().__init__(code, message, status=404)


class RateLimited(ApplicationError):
    """Over an abuse limit (docs/moderation.md#limits); `retry_after` seconds until it lets through again.
    API answers carry it in the body and in a Retry-After header."""

    def __init__(self, message: str, *, retry_after: int, code: str = "rate_limited") -> None:
        super().__init__(code, message, status=429, extra={"retry_after": retry_after})
        self.retry_after = retry_after


def drf_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every API error body is `{"code", "detail"}`.

    Validation errors keep their per-field messages under `errors`. A body over Django's upload limits
    is answered here too (413 `request_too_large`), not by the site's HTML error page.
    """
    if isinstance(exc, RateLimited):
        return Response(exc.as_dict(), status=exc.status, headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, ApplicationError):
        return Response(exc.as_dict(), status=exc.status)
    if isinstance(exc, RequestDataTooBig):  # DATA_UPLOAD_MAX_MEMORY_SIZE: raised when the view reads the body
        detail = f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes."
        return Response(
            {"code": "request_too_large", "detail": detail}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
        )
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        return Response({"code": "too_many_fields", "detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_default_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response

    if isinstance(exc, exceptions.ValidationError):
        response.data = {"code": "invalid", "detail": "Invalid input.", "errors": exc.detail}
        response.status_code = status.HTTP_400_BAD_REQUEST
        return response

    codes = exc.get_codes()
    code = codes if isinstance(codes, str) else exc.default_code
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.default_detail)
    response.data = {"code": code, "detail": str(detail)}
    return response
