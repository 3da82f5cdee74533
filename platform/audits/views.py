"""The checkpoint upload's endpoint (audits.upload does the work)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from audits.upload import chunk_receive
from common.errors import ApplicationError, RateLimited


@csrf_exempt  # a node authenticates with its token, not a browser session
@require_http_methods(["PUT"])
def checkpoint_upload(request: HttpRequest, audit_id: str) -> JsonResponse:
    try:
        answer = chunk_receive(
            audit_id=audit_id,
            authorization=request.headers.get("Authorization"),
            content_range=request.headers.get("Content-Range"),
            content_length=request.headers.get("Content-Length"),
            sha256=request.headers.get("X-Checkpoint-Sha256"),
            read=request.read,
        )
    except RateLimited as exc:
        response = JsonResponse(exc.as_dict(), status=exc.status)
        response["Retry-After"] = str(exc.retry_after)
        return response
    except ApplicationError as exc:
        return JsonResponse(exc.as_dict(), status=exc.status)
    return JsonResponse(answer)
