"""/stats/: the daily statistics export, served as the files figures.export wrote (no query per request)."""

from __future__ import annotations

from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from figures import export


@require_GET
def stats_index(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "web/stats_export.html",
        {
            "index": export.export_index(),
            "columns": export.COLUMNS,
            "every_hours": int(export.EXPORT_EVERY.total_seconds() // 3600),
        },
    )


@require_GET
@cache_control(public=True, max_age=export.EXPORT_CACHE_SECONDS)
def stats_file(request: HttpRequest, name: str) -> FileResponse:
    path = export.export_file(name)
    if path is None:
        raise Http404("No such file.")
    if name == export.INDEX:
        return FileResponse(path.open("rb"), content_type="application/json")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name, content_type="application/gzip")
