"""Probes and metrics for whoever runs the site (docs/deploy.md, "Operations").

/healthz   liveness: the process answers HTTP (no database, no channel layer)
/readyz    readiness: the database and the channel layer answer; 503 with what failed otherwise. Also
           says whether the texts' retention stopped at a day (`retention`), which is not readiness:
           the site serves as before, but the operator must fix the archive folder
/metrics   Prometheus text format (common.metrics, ops.collectors)
/favicon.ico  the site's icon, for pages that name none (the admin's)
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
from pathlib import Path

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from common.loops import per_loop
from common.redis_client import async_pool
from ops.collectors import AuditsCollector, PoolCollector

#: Seconds each readiness check may take before it counts as failed.
READY_TIMEOUT = 3.0


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok\n", content_type="text/plain")


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _new_redis():
    import redis.asyncio as aioredis

    return aioredis.Redis(connection_pool=async_pool(settings.REDIS_URL))


#: A client of the channel layer's Redis, on a pool of its own, per event loop.
_redis = per_loop(_new_redis)


async def _channel_layer() -> None:
    """With REDIS_URL, Redis answers a PING on a connection of the probe's own. (A message through the
    layer would queue behind the closes listener: channels_redis lets one `receive` through per layer at
    a time, and sockets.closes waits in one for as long as the process serves node sockets.) Without,
    a message through the in-memory layer and back."""
    if settings.REDIS_URL:
        if not await _redis().ping():
            raise RuntimeError("Redis did not answer PONG")
        return
    layer = get_channel_layer()
    channel = await layer.new_channel("readyz.")
    await layer.send(channel, {"type": "readyz.ping"})
    message = await layer.receive(channel)
    if message.get("type") != "readyz.ping":
        raise RuntimeError("the channel layer returned another message")


async def _check(name: str, coroutine) -> tuple[str, str]:
    try:
        await asyncio.wait_for(coroutine, READY_TIMEOUT)
    except TimeoutError:
        return name, f"no answer within {READY_TIMEOUT:g} s"
    except Exception as exc:  # any failure means "not ready"; the body says which
        return name, f"{type(exc).__name__}: {exc}"[:300]
    return name, "ok"


@never_cache
@require_GET
async def readyz(request: HttpRequest) -> JsonResponse:
    results = dict(
        await asyncio.gather(
            _check("database", sync_to_async(_database)()),
            _check("channel_layer", _channel_layer()),
        )
    )
    ready = all(value == "ok" for value in results.values())
    retention = "unknown (no database)"
    if results["database"] == "ok":
        try:
            retention = await sync_to_async(_retention)()
        except Exception as exc:  # reported, never a reason to be unready
            retention = f"{type(exc).__name__}: {exc}"[:300]
    return JsonResponse({"ready": ready, **results, "retention": retention}, status=200 if ready else 503)


def _retention() -> str:
    """The retention's state: ok, or the first day it stopped at and why (pool.retention)."""
    from pool.retention import retention_errors

    errors = retention_errors()
    if not errors:
        return "ok"
    return f"stopped at {errors[0].day}: {errors[0].error}"[:500]


_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w*_(\d+)\.db")


def _forget_dead_processes(directory: str) -> None:
    """Drop the live gauges (sockets open) of processes that are gone. A process killed with SIGKILL
    never says it died, and its file would count its sockets as open until the directory is wiped.
    The directory is one host's, so its pids are this host's."""
    for path in Path(directory).glob("gauge_live*_*.db"):
        match = _LIVE_GAUGE_FILE.fullmatch(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, directory)
        except PermissionError:  # alive, another user's
            pass


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    if settings.PROMETHEUS_MULTIPROC_DIR:
        _forget_dead_processes(settings.PROMETHEUS_MULTIPROC_DIR)
        multiprocess.MultiProcessCollector(registry)  # every process's files, summed
    else:
        registry.register(_ProcessRegistry())
    registry.register(PoolCollector())
    registry.register(AuditsCollector())
    return registry


class _ProcessRegistry:
    """This process's metrics (the default registry: common.metrics plus process and Python figures)."""

    def collect(self):
        return REGISTRY.collect()


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.SAPO_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse("a bearer token is required\n", status=401, content_type="text/plain")
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's): the site's icon."""
    return HttpResponsePermanentRedirect(static("img/favicon.svg"))
