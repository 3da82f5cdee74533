"""Which swarm a node socket is in, and telling sockets when their swarm changes.

A socket's swarm comes from its `hello` (`place_of_hello`; none named: the site's default), read at
most once per settings.SAPO_SWARM_PLACE_SECONDS per process and swarm (a crowd of nodes saying hello at once costs one
query per swarm); `any`'s choice (an aggregate over the open swarms' recent groups) is kept as long.
Whoever's hello reads the tables pays what the read cost from its CPU budget (sockets.ratelimit). A staff change of a swarm (swarms.signals.swarm_changed) is a socket order
(nodes.events), written in the change's transaction: every server process forgets its copy and tells
its sockets of that swarm (sockets.closes, sockets.consumers) within seconds, whatever Redis does. A change
that names a newer catalogue version makes each socket read its place again (`place_after_change`,
once per process), so a dataset staff withdrew is refused on sockets opened before the change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from common.db import db_call
from common.errors import ApplicationError
from common.loops import per_loop
from nodes.events import socket_order
from pool.limits import Limits
from pool.models import Rollout
from sapo_node import protocol
from swarms.models import Swarm, SwarmState
from swarms.selectors import MAX_NAMED, SwarmPlace, swarm_for_hello, swarm_open_slugs, swarm_place
from swarms.services import swarm_default_ensure

#: `--swarm any`: the open swarm with the fewest nodes whose groups entered its pool this long ago or since.
ACTIVE_WINDOW = timedelta(minutes=10)
#: The channel-layer message type of a swarm's change.
SWARM_CHANGED = "swarm.changed"

_places: dict[str | None, tuple[float, SwarmPlace]] = {}


def place_forget(swarm_id: int) -> None:
    """Drop this process's copy of one swarm's place, and always the default's and `any`'s: a change of
    any swarm may change which swarm is the default, and which needs nodes."""
    for key, (_, place) in list(_places.items()):
        if place.swarm_id == swarm_id or key in (None, protocol.ANY_SWARM):
            _places.pop(key, None)


def places_forget() -> None:
    """Drop this process's copies of every swarm's place."""
    _places.clear()


def place_of_hello(*, slug: str | None) -> tuple[SwarmPlace, float]:
    """The place of the swarm a hello names: its slug, protocol.ANY_SWARM (`swarm_needing_nodes`), or
    None (the site's default); and the seconds reading it took (0 from this process's copy), which
    the caller charges to the node's CPU budget. Raises ApplicationError "unknown_swarm" or
    "swarm_retired"."""
    cached = _places.get(slug)
    if cached is not None and time.monotonic() - cached[0] < settings.SAPO_SWARM_PLACE_SECONDS:
        return cached[1], 0.0
    # Wall time, not this thread's CPU: the work is PostgreSQL's (any's aggregate above all).
    started = time.perf_counter()
    if slug == protocol.ANY_SWARM:
        place = swarm_place(swarm=swarm_needing_nodes())
    else:
        if slug is None:
            swarm_default_ensure()
        place = swarm_place(swarm=swarm_for_hello(slug=slug))
    _places[slug] = (time.monotonic(), place)
    return place, time.perf_counter() - started


def swarm_needing_nodes() -> Swarm:
    """The open swarm that needs nodes most: the fewest distinct nodes with groups stored in its pool
    over the last ACTIVE_WINDOW (an index range per swarm: pool_rollout_swarm_fresh_idx); ties go to
    the default swarm, then the oldest. Raises "unknown_swarm" when no swarm is open."""
    open_swarms = list(Swarm.objects.filter(state=SwarmState.OPEN).order_by("-is_default", "id"))
    if not open_swarms:
        raise ApplicationError(protocol.UNKNOWN_SWARM, "no swarm of this site is open")
    since = timezone.now() - ACTIVE_WINDOW
    active = dict(
        Rollout.objects.filter(swarm_id__in=[s.id for s in open_swarms], sampleable=True, created_at__gte=since)
        .values("swarm_id")
        .annotate(nodes=Count("node_id", distinct=True))
        .values_list("swarm_id", "nodes")
    )
    return min(open_swarms, key=lambda s: active.get(s.id, 0))  # min keeps the first of equals


def place_limits(site: Limits, place: SwarmPlace) -> Limits:
    """The site's limits with the swarm's overrides."""
    overrides: dict[str, Any] = {}
    if place.sample_window_seconds is not None:
        overrides["sample_window_seconds"] = place.sample_window_seconds
    if place.max_stored_bytes_per_node_hour is not None:
        overrides["max_stored_bytes_per_node_hour"] = place.max_stored_bytes_per_node_hour
    return dataclasses.replace(site, **overrides) if overrides else site


def place_of_swarm(*, swarm_id: int) -> SwarmPlace:
    """The swarm's place as the tables hold it now (its current catalogue version), not this process's
    copy: what a socket takes when a change of its swarm names a newer catalogue version."""
    return swarm_place(swarm=Swarm.objects.get(id=swarm_id))


async def place_after_change(swarm_id: int, version: int) -> SwarmPlace:
    """`place_of_swarm`, read once per event loop for each (swarm, catalogue version) a change names,
    however many of its sockets ask together (every socket of a swarm asks when its catalogue changes)."""
    reads = _rereads()
    key = (swarm_id, version)
    task = reads.get(key)
    if task is None:
        task = reads[key] = asyncio.ensure_future(db_call(place_of_swarm, retry_lost=True)(swarm_id=swarm_id))
        task.add_done_callback(lambda _: reads.pop(key, None))
    return await asyncio.shield(task)


_rereads = per_loop(dict)


def swarm_state_message(*, slug: str, state: str, open_swarms: list[str]) -> dict[str, Any]:
    """The `swarm_state` frame a socket gets when its swarm changes state (docs/protocol.md)."""
    others = ", ".join(s for s in open_swarms if s != slug) or "none"
    detail = {
        SwarmState.OPEN: f"swarm {slug!r} is open again: sharing resumes",
        SwarmState.PAUSED: f"swarm {slug!r} is paused by its operators: train in silo, nothing is shared until it opens",
        SwarmState.RETIRED: f"swarm {slug!r} is retired; open swarms: {others}",
    }[state]
    return {"type": protocol.SWARM_STATE, "swarm": slug, "state": state, "detail": detail, "open": open_swarms}


def swarm_changed_broadcast(*, swarm: Swarm, **_: Any) -> None:
    """swarms.signals.swarm_changed's receiver (SocketsConfig.ready()), in the change's transaction: an
    order every server process carries out once the change commits (nodes.events)."""
    swarm_id = swarm.id
    socket_order(
        {
            "type": SWARM_CHANGED,
            "swarm_id": swarm_id,
            "slug": swarm.slug,
            "state": swarm.state,
            "catalogue_version": swarm.catalogue_version,  # a newer one: the sockets read their place again
            "open": swarm_open_slugs()[:MAX_NAMED],  # a short frame whatever the site hosts
        }
    )
    transaction.on_commit(lambda: place_forget(swarm_id))
