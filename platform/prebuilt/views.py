"""/models/: the prebuilt models' manifest and files, as `manage.py sapo_models build` wrote them (no
query per request). Only files the manifest lists are served."""

from __future__ import annotations

from django.http import FileResponse, Http404, HttpRequest
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

from prebuilt import selectors

#: A manifest changes when the operator publishes; a file only with a forced rebuild, which changes
#: its sha256 (the ETag) and the manifest, so a node holding a stale copy refuses it and builds.
MANIFEST_CACHE_SECONDS = 300
FILE_CACHE_SECONDS = 3600


@require_safe
@cache_control(public=True, max_age=MANIFEST_CACHE_SECONDS)
def manifest(request: HttpRequest) -> FileResponse:
    path = selectors.manifest_path()
    if not path.is_file():
        raise Http404("This site publishes no prebuilt models.")
    return FileResponse(path.open("rb"), content_type="application/json")


@require_safe
@cache_control(public=True, max_age=FILE_CACHE_SECONDS)
def model_file(request: HttpRequest, folder: str, name: str) -> FileResponse:
    found = selectors.published_file(folder=folder, name=name)
    if found is None:
        raise Http404("No such file.")
    path, listed = found
    response = FileResponse(path.open("rb"), content_type="application/octet-stream")
    response["ETag"] = f'"{listed.sha256}"'
    response["X-Checksum-Sha256"] = listed.sha256
    return response
