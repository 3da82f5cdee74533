"""/models/: the prebuilt models' manifest and files, as `manage.py sapo_models build` wrote them (no
query per request). Only files the manifest lists are served."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from django.http import FileResponse, Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

from prebuilt import selectors

#: A manifest changes when the operator publishes; a file only with a forced rebuild, which changes
#: its sha256 (the ETag) and the manifest, so a node holding a stale copy refuses it and builds.
MANIFEST_CACHE_SECONDS = 300
FILE_CACHE_SECONDS = 3600
#: Bytes read at a time for a part of a file.
PART_CHUNK = 1 << 20


@require_safe
@cache_control(public=True, max_age=MANIFEST_CACHE_SECONDS)
def manifest(request: HttpRequest) -> FileResponse:
    path = selectors.manifest_path()
    if not path.is_file():
        raise Http404("This site publishes no prebuilt models.")
    return FileResponse(path.open("rb"), content_type="application/json")


@require_safe
@cache_control(public=True, max_age=FILE_CACHE_SECONDS)
def model_file(request: HttpRequest, folder: str, name: str) -> HttpResponse:
    """The file, or with `Range: bytes=START-[END]` the part a cut download lacks (206). An `If-Range`
    that is not the file's ETag gets the whole file (200): the node's part was of another file."""
    found = selectors.published_file(folder=folder, name=name)
    if found is None:
        raise Http404("No such file.")
    path, listed = found
    etag = f'"{listed.sha256}"'
    size = path.stat().st_size
    wanted = request.headers.get("Range")
    if wanted is not None and request.headers.get("If-Range", etag) == etag:
        try:
            part = byte_range(wanted, size)
        except ValueError:
            refused = HttpResponse(status=416)
            refused["Content-Range"] = f"bytes */{size}"
            refused["ETag"] = etag
            return refused
        if part is not None:
            start, end = part
            response: HttpResponse = StreamingHttpResponse(
                _read_part(path, start, end), status=206, content_type="application/octet-stream"
            )
            response["Content-Range"] = f"bytes {start}-{end}/{size}"
            response["Content-Length"] = str(end - start + 1)
            response["ETag"] = etag
            response["X-Checksum-Sha256"] = listed.sha256
            response["Accept-Ranges"] = "bytes"
            return response
    response = FileResponse(path.open("rb"), content_type="application/octet-stream")
    response["ETag"] = etag
    response["X-Checksum-Sha256"] = listed.sha256
    response["Accept-Ranges"] = "bytes"
    return response


_RANGE = re.compile(r"^bytes=(\d{1,19})-(\d{1,19})?$")


def byte_range(header: str, size: int) -> tuple[int, int] | None:
    """(first, last) byte of one `bytes=START-[END]` range of a file of `size` bytes (END past the
    end means the end); None for any other form (several ranges, a suffix `bytes=-N`, nonsense),
    which gets the whole file, as RFC 9110 lets a server. Raises ValueError for a range the file
    cannot satisfy (416)."""
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    start = int(match.group(1))
    end = min(int(match.group(2)), size - 1) if match.group(2) is not None else size - 1
    if start >= size or end < start:
        raise ValueError(header)
    return start, end


def _read_part(path: Path, start: int, end: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(start)
        left = end - start + 1
        while left > 0:
            chunk = f.read(min(PART_CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk
