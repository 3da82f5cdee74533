"""Reads of swarms: by slug, a page's pick, the default one, the open ones, a version's catalogue."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import ApplicationError, NotFound
from sapo_node import protocol
from sapo_node.tasks import Catalogue
from swarms.catalogue import catalogue_from_entries
from swarms.models import Swarm, SwarmCatalogue, SwarmState
from swarms.scope import SITE, Scope


@dataclass(frozen=True)
class SwarmPlace:
    """What a node socket holds of its swarm: from its hello until the next, or until a change of the
    swarm reaches it through sockets.closes (a new catalogue version: the socket reads its place again)."""

    swarm_id: int
    slug: str
    state: str
    catalogue_version: int
    catalogue: Catalogue
    recommended_models: tuple[str, ...]
    default_local: int
    default_external: int
    sample_window_seconds: int | None
    max_stored_bytes_per_node_hour: int | None


def swarm_list(*, include_retired: bool = True) -> list[Swarm]:
    swarms = Swarm.objects.all()
    if not include_retired:
        swarms = swarms.exclude(state=SwarmState.RETIRED)
    return list(swarms)


def swarm_get(*, slug: str) -> Swarm:
    swarm = Swarm.objects.filter(slug=slug).first()
    if swarm is None:
        raise NotFound("No such swarm.")
    return swarm


@dataclass(frozen=True, slots=True)
class SwarmPick:
    """What a page's `?swarm=` selector picked: the scope of what the page shows, and the swarm the page
    names (None when it names none: then the scope is the whole site)."""

    scope: Scope
    swarm: Swarm | None


def swarm_pick(slug: str | None) -> SwarmPick:
    """The pick of a `?swarm=` selector: the whole site when empty, else the swarm it names. An unknown
    slug raises NotFound: what a page shows under a swarm's name must be that swarm's."""
    slug = str(slug or "").strip()[:64]
    if not slug:
        return SwarmPick(SITE, None)
    swarm = swarm_get(slug=slug)
    return SwarmPick(Scope.swarm(swarm.id), swarm)


def swarm_default() -> Swarm | None:
    return Swarm.objects.filter(is_default=True).first()


def swarm_open_slugs() -> list[str]:
    return list(Swarm.objects.filter(state=SwarmState.OPEN).order_by("slug").values_list("slug", flat=True))


def swarm_catalogue(*, swarm: Swarm, version: int | None = None) -> SwarmCatalogue:
    return SwarmCatalogue.objects.get(swarm=swarm, version=swarm.catalogue_version if version is None else version)


def swarm_place(*, swarm: Swarm) -> SwarmPlace:
    """The swarm's place for a socket: its current catalogue version, settings and state."""
    row = swarm_catalogue(swarm=swarm)
    earlier = SwarmCatalogue.objects.filter(swarm=swarm, version__lt=row.version).values_list("entries", flat=True)
    withdrawn = frozenset(e["dataset"] for entries in earlier for e in entries)
    return SwarmPlace(
        swarm_id=swarm.id,
        slug=swarm.slug,
        state=swarm.state,
        catalogue_version=row.version,
        catalogue=catalogue_from_entries(name=f"{swarm.slug}@{row.version}", entries=row.entries, withdrawn=withdrawn),
        recommended_models=tuple(swarm.recommended_models or ()),
        default_local=swarm.default_local,
        default_external=swarm.default_external,
        sample_window_seconds=swarm.sample_window_seconds,
        max_stored_bytes_per_node_hour=swarm.max_stored_bytes_per_node_hour,
    )


#: Open swarms a refusal names at most (its detail stays short whatever the site hosts).
MAX_NAMED = 20


def swarm_for_hello(*, slug: str | None) -> Swarm:
    """The swarm a hello names (None: the site's default). Raises ApplicationError with the protocol's
    code: "unknown_swarm" (no such swarm, or no default), "swarm_retired"; the detail lists the open
    swarms, which the node client shows in its one line."""
    swarm = swarm_default() if slug is None else Swarm.objects.filter(slug=slug).first()
    if swarm is not None and swarm.state != SwarmState.RETIRED:
        return swarm
    slugs = swarm_open_slugs()
    open_ = ", ".join(slugs[:MAX_NAMED]) + (f" and {len(slugs) - MAX_NAMED} more" if len(slugs) > MAX_NAMED else "")
    open_ = open_ or "none"
    if swarm is None:
        named = "the site has no default swarm" if slug is None else f"no swarm named {slug!r}"
        raise ApplicationError(protocol.UNKNOWN_SWARM, f"{named}; open swarms: {open_}", extra={"open": open_})
    raise ApplicationError(
        protocol.SWARM_RETIRED, f"swarm {swarm.slug!r} is retired; open swarms: {open_}", extra={"open": open_}
    )
