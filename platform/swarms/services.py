"""Staff writes to swarms: create, edit, a new catalogue version, open, pause, retire.

Each runs in one transaction with its audit entry (swarms.seams: moderation's audit log) and, for a
change nodes must hear of, `swarms.signals.swarm_changed` (the pool tells the swarm's open sockets
once it commits). Untrusted text (title, description, model names) is cleaned, bounded and screened by
the site's text rules before anything is stored.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import connection, transaction
from psycopg import sql

from common.errors import ApplicationError
from sapo_node.tasks import CATALOGUES
from swarms.catalogue import catalogue_entries_clean, entries_of_catalogue
from swarms.models import (
    ANY_SWARM,
    DEFAULT_SLUG,
    DEFAULT_TITLE,
    DESCRIPTION_MAX_LENGTH,
    MAX_RECOMMENDED_MODELS,
    MODEL_NAME_MAX_LENGTH,
    TITLE_MAX_LENGTH,
    Swarm,
    SwarmCatalogue,
    SwarmState,
    sample_sequence_name,
    slug_validator,
)
from swarms.seams import oversight
from swarms.signals import swarm_changed

#: The audit log's action for each change (moderation.models.AuditAction has them).
AUDIT_CREATE = "swarm_create"
AUDIT_EDIT = "swarm_edit"
AUDIT_CATALOGUE = "swarm_catalogue"
AUDIT_STATE = {SwarmState.OPEN: "swarm_open", SwarmState.PAUSED: "swarm_pause", SwarmState.RETIRED: "swarm_retire"}
#: Bounds of a swarm's per-swarm limits (a sampling window from a minute to 30 days; a node's hourly
#: storage from 1 MiB to 1 GiB).
WINDOW_BOUNDS = (60, 30 * 86_400)
NODE_HOUR_BYTES_BOUNDS = (1 << 20, 1 << 30)
MAX_IJ = 256


def _hidden(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in text.replace("\n", " ").replace("\t", " "))


def _clean_text(value: object, *, field: str, max_length: int, required: bool, multiline: bool = False) -> str:
    raw = str(value or "")
    text = (
        "\n".join(" ".join(line.split()) for line in raw.strip().splitlines()) if multiline else " ".join(raw.split())
    )
    if _hidden(raw) or len(text) > max_length or (required and not text):
        need = f"1-{max_length}" if required else f"at most {max_length}"
        raise ApplicationError(
            "invalid_swarm", f"{field}: {need} characters, no control characters.", extra={"field": field}
        )
    return text


def _clean_slug(slug: object) -> str:
    text = str(slug or "").strip()
    try:
        slug_validator(text)
    except ValidationError:
        raise ApplicationError("invalid_swarm", f"slug: {slug_validator.message}", extra={"field": "slug"}) from None
    if text == ANY_SWARM:
        raise ApplicationError(
            "invalid_swarm", "slug: 'any' is how a node asks the server to choose.", extra={"field": "slug"}
        )
    return text


def _clean_models(models: object) -> list[str]:
    if models in (None, ""):
        return []
    items = models.split(",") if isinstance(models, str) else models
    if not isinstance(items, list | tuple) or len(items) > MAX_RECOMMENDED_MODELS:
        raise ApplicationError(
            "invalid_swarm",
            f"recommended_models: at most {MAX_RECOMMENDED_MODELS} names.",
            extra={"field": "recommended_models"},
        )
    names = [
        _clean_text(m, field="recommended_models", max_length=MODEL_NAME_MAX_LENGTH, required=False) for m in items
    ]
    return list(dict.fromkeys(n for n in names if n))


def _clean_int(value: object, *, field: str, bounds: tuple[int, int], nullable: bool) -> int | None:
    if value in (None, "") and nullable:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number is None or not bounds[0] <= number <= bounds[1]:
        raise ApplicationError(
            "invalid_swarm", f"{field}: an integer in [{bounds[0]}, {bounds[1]}].", extra={"field": field}
        )
    return number


def _require_staff(actor: Any) -> None:
    if actor is None or not getattr(actor, "is_staff", False):
        raise ApplicationError("forbidden", "Only staff can change swarms.", status=403)


#: The editable fields and how each is cleaned.
_FIELDS = {
    "title": lambda v: _clean_text(v, field="title", max_length=TITLE_MAX_LENGTH, required=True),
    "description": lambda v: _clean_text(
        v, field="description", max_length=DESCRIPTION_MAX_LENGTH, required=False, multiline=True
    ),
    "recommended_models": _clean_models,
    "default_local": lambda v: _clean_int(v, field="default_local", bounds=(0, MAX_IJ), nullable=False),
    "default_external": lambda v: _clean_int(v, field="default_external", bounds=(0, MAX_IJ), nullable=False),
    "sample_window_seconds": lambda v: _clean_int(
        v, field="sample_window_seconds", bounds=WINDOW_BOUNDS, nullable=True
    ),
    "max_stored_bytes_per_node_hour": lambda v: _clean_int(
        v, field="max_stored_bytes_per_node_hour", bounds=NODE_HOUR_BYTES_BOUNDS, nullable=True
    ),
}


def _clean_fields(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise ApplicationError("invalid_swarm", f"unknown fields {unknown}", extra={"field": unknown[0]})
    cleaned = {name: _FIELDS[name](value) for name, value in fields.items()}
    texts = [cleaned[k] for k in ("title", "description") if cleaned.get(k)] + list(
        cleaned.get("recommended_models", [])
    )
    if texts:
        oversight().text_screen(texts=texts, what="swarm's text")
    return cleaned


def swarm_sequence_create(swarm_id: int) -> None:
    """The swarm's own sample-number sequence (swarms.models.sample_sequence_name)."""
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(sql.Identifier(sample_sequence_name(swarm_id)))
        )


def swarm_create(*, actor: Any, slug: object, entries: object, reason: str = "", **fields: Any) -> Swarm:
    """A new open swarm with its first catalogue version and its sample sequence.

    Raises ApplicationError: forbidden (403), invalid_swarm (with `field`), invalid_catalogue (with
    `field`), text_blocked, swarm_slug_taken (409)."""
    _require_staff(actor)
    slug = _clean_slug(slug)
    cleaned = _clean_fields({"title": fields.pop("title", ""), **fields})
    catalogue = catalogue_entries_clean(entries)
    with transaction.atomic():
        if Swarm.objects.filter(slug=slug).exists():
            raise ApplicationError(
                "swarm_slug_taken", f"A swarm named {slug!r} exists.", status=409, extra={"field": "slug"}
            )
        swarm = Swarm.objects.create(slug=slug, catalogue_version=1, **cleaned)
        SwarmCatalogue.objects.create(swarm=swarm, version=1, entries=catalogue, created_by=actor)
        swarm_sequence_create(swarm.id)
        oversight().staff_action_audit(
            actor=actor, action=AUDIT_CREATE, swarm_id=swarm.id, reason=reason or "created", details={"slug": slug}
        )
    return swarm


def swarm_update(*, actor: Any, swarm: Swarm, reason: str = "", **fields: Any) -> Swarm:
    """Edit a swarm's title, description, recommended models, default I/J and limits. A retired swarm
    is an archive: refused ("swarm_retired")."""
    _require_staff(actor)
    cleaned = _clean_fields(fields)
    with transaction.atomic():
        swarm = Swarm.objects.select_for_update().get(id=swarm.id)
        if swarm.state == SwarmState.RETIRED:
            raise ApplicationError("swarm_retired", "A retired swarm is a read-only archive.", status=409)
        changed = {k: v for k, v in cleaned.items() if getattr(swarm, k) != v}
        for name, value in changed.items():
            setattr(swarm, name, value)
        if changed:
            swarm.save(update_fields=[*changed, "updated_at"])
            oversight().staff_action_audit(
                actor=actor,
                action=AUDIT_EDIT,
                swarm_id=swarm.id,
                reason=reason or "edited",
                details={"changed": changed},
            )
            swarm_changed.send(sender=Swarm, swarm=swarm)
    return swarm


def swarm_catalogue_set(*, actor: Any, swarm: Swarm, entries: object, reason: str = "") -> SwarmCatalogue:
    """Write the swarm's next catalogue version and point the swarm at it. Groups stored before keep
    their version; sockets open now take the new one once it commits (sockets.swarm_places: the
    swarm_changed order names it), and refuse groups of a dataset it dropped (`task_withdrawn`). Raises invalid_catalogue (with `field`), swarm_retired."""
    _require_staff(actor)
    catalogue = catalogue_entries_clean(entries)
    with transaction.atomic():
        swarm = Swarm.objects.select_for_update().get(id=swarm.id)
        if swarm.state == SwarmState.RETIRED:
            raise ApplicationError("swarm_retired", "A retired swarm is a read-only archive.", status=409)
        version = swarm.catalogue_version + 1
        row = SwarmCatalogue.objects.create(swarm=swarm, version=version, entries=catalogue, created_by=actor)
        swarm.catalogue_version = version
        swarm.save(update_fields=["catalogue_version", "updated_at"])
        oversight().staff_action_audit(
            actor=actor,
            action=AUDIT_CATALOGUE,
            swarm_id=swarm.id,
            reason=reason or f"catalogue version {version}",
            details={"version": version, "datasets": [e["dataset"] for e in catalogue]},
        )
        swarm_changed.send(sender=Swarm, swarm=swarm)
    return row


def swarm_state_set(*, actor: Any, swarm: Swarm, state: str, reason: str) -> Swarm:
    """Open, pause or retire a swarm; its connected nodes hear of it within seconds (sockets.closes).
    Retiring is final, and the default swarm cannot be retired (make another the default first).
    Raises ApplicationError: forbidden, invalid_state, swarm_retired, default_swarm, reason_required."""
    _require_staff(actor)
    if state not in SwarmState.values:
        raise ApplicationError("invalid_state", f"Unknown state {state!r}.")
    if not " ".join(str(reason or "").split()):
        raise ApplicationError("reason_required", "A reason is required.")
    with transaction.atomic():
        swarm = Swarm.objects.select_for_update().get(id=swarm.id)
        if swarm.state == SwarmState.RETIRED:
            raise ApplicationError("swarm_retired", "A retired swarm is a read-only archive.", status=409)
        if state == SwarmState.RETIRED and swarm.is_default:
            raise ApplicationError(
                "default_swarm", "Make another swarm the default before retiring this one.", status=409
            )
        if swarm.state == state:
            return swarm
        before, swarm.state = swarm.state, state
        swarm.save(update_fields=["state", "updated_at"])
        oversight().staff_action_audit(
            actor=actor,
            action=AUDIT_STATE[state],
            swarm_id=swarm.id,
            reason=reason,
            details={"from": before, "to": state},
        )
        swarm_changed.send(sender=Swarm, swarm=swarm)
    return swarm


def swarm_make_default(*, actor: Any, swarm: Swarm, reason: str) -> Swarm:
    """Make an open swarm the one nodes that name none join (the partial unique constraint keeps one)."""
    _require_staff(actor)
    with transaction.atomic():
        swarm = Swarm.objects.select_for_update().get(id=swarm.id)
        if swarm.state != SwarmState.OPEN:
            raise ApplicationError("swarm_not_open", "Only an open swarm can be the default.", status=409)
        Swarm.objects.filter(is_default=True).exclude(id=swarm.id).update(is_default=False)
        swarm.is_default = True
        swarm.save(update_fields=["is_default", "updated_at"])
        oversight().staff_action_audit(
            actor=actor,
            action=AUDIT_EDIT,
            swarm_id=swarm.id,
            reason=reason or "made the default",
            details={"is_default": True},
        )
    return swarm


def swarm_default_ensure() -> Swarm:
    """The site's default swarm; made from the site's catalogue (settings.SAPO_CATALOGUE) when the
    site has none: a site that never created a swarm serves today's clients unchanged (the data
    migration makes it on an existing site; this covers a database emptied since, such as a test's)."""
    swarm = Swarm.objects.filter(is_default=True).first()
    if swarm is not None:
        return swarm
    name = getattr(settings, "SAPO_CATALOGUE", None) or "sapo"
    catalogue = CATALOGUES.get(name)
    if catalogue is None:
        raise ImproperlyConfigured(f"SAPO_CATALOGUE={name!r}: choose one of {sorted(CATALOGUES)}")
    with transaction.atomic():
        swarm, created = Swarm.objects.get_or_create(
            is_default=True,
            defaults={"slug": DEFAULT_SLUG, "title": DEFAULT_TITLE, "catalogue_version": 1},
        )
        if created:
            SwarmCatalogue.objects.create(swarm=swarm, version=1, entries=entries_of_catalogue(catalogue))
            swarm_sequence_create(swarm.id)
    return swarm
