"""Swarms: the training campaigns one site hosts, each with its own pool, catalogue and state.

A `Swarm` is what an operator opens, pauses and retires; a node names one in its `hello`
(docs/protocol.md, "hello -> welcome"). Its catalogue is versioned: a `SwarmCatalogue` row is never
changed, an edit writes the next version and the swarm points at it, and every stored group keeps the
version it was verified under (`pool.Rollout.catalogue_version`).

Every swarm numbers its sampleable groups densely with a PostgreSQL sequence of its own
(`sample_sequence_name`), created with the swarm (swarms.services.swarm_create), so a draw is index
lookups in one swarm's numbers whatever the number of swarms (docs/protocol.md, "sample -> samples").
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

SLUG_MAX_LENGTH = 40
TITLE_MAX_LENGTH = 80
DESCRIPTION_MAX_LENGTH = 1000
MAX_RECOMMENDED_MODELS = 16
MODEL_NAME_MAX_LENGTH = 100
MAX_CATALOGUE_ENTRIES = 32
#: The swarm a site without any is given (the data migration, swarms.services.swarm_default_ensure).
DEFAULT_SLUG = "main"
DEFAULT_TITLE = "Main swarm"
#: `--swarm any` asks the server to choose; no swarm may take the name.
ANY_SWARM = "any"

SLUG_RE = r"^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$"
slug_validator = RegexValidator(
    SLUG_RE, "A swarm's slug is 1-40 lowercase letters, digits and hyphens, starting and ending with a letter or digit."
)


class SwarmState(models.TextChoices):
    OPEN = "open", "Open"
    PAUSED = "paused", "Paused (nodes train in silo, nothing is shared)"
    RETIRED = "retired", "Retired (read-only archive)"


#: A swarm's sample sequence is this prefix and its id (SQL that numbers rows of several swarms
#: builds the name from the row's swarm_id: pool.services).
SAMPLE_SEQUENCE_PREFIX = "swarms_sample_seq_"


def sample_sequence_name(swarm_id: int) -> str:
    """The PostgreSQL sequence that numbers the swarm's sampleable groups."""
    return f"{SAMPLE_SEQUENCE_PREFIX}{int(swarm_id)}"


class Swarm(models.Model):
    slug = models.CharField(max_length=SLUG_MAX_LENGTH, unique=True, validators=[slug_validator])
    title = models.CharField(max_length=TITLE_MAX_LENGTH)
    description = models.TextField(blank=True, max_length=DESCRIPTION_MAX_LENGTH)
    state = models.CharField(max_length=16, choices=SwarmState.choices, default=SwarmState.OPEN)
    recommended_models = models.JSONField(default=list, blank=True, help_text="Model names; empty means any.")
    default_local = models.PositiveSmallIntegerField(default=4, help_text="I: groups of its own a node trains on.")
    default_external = models.PositiveSmallIntegerField(default=4, help_text="J: groups from the pool per round.")
    # Per-swarm overrides of the site's limits (settings.SAPO_LIMITS); null keeps the site's.
    sample_window_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_stored_bytes_per_node_hour = models.PositiveBigIntegerField(null=True, blank=True)
    catalogue_version = models.PositiveIntegerField(default=0, help_text="The current SwarmCatalogue version.")
    is_default = models.BooleanField(default=False, help_text="Where a node that names no swarm goes.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-is_default", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="swarms_one_default"),
            models.CheckConstraint(condition=~Q(slug=ANY_SWARM), name="swarms_slug_not_any"),
            models.CheckConstraint(condition=Q(default_local__lte=256, default_external__lte=256), name="swarms_ij"),
        ]

    def __str__(self) -> str:
        return self.slug

    @property
    def sample_sequence(self) -> str:
        return sample_sequence_name(self.id)


class SwarmCatalogueQuerySet(models.QuerySet):
    def update(self, **kwargs):  # noqa: ANN003 - mirrors QuerySet.update
        raise PermissionError("a catalogue version is never changed: write the next one")

    def delete(self):
        raise PermissionError("a catalogue version is never deleted: groups name it")


class SwarmCatalogue(models.Model):
    """One version of a swarm's catalogue: `entries` is a list of {"dataset", "config", "weight"}
    (a reasoning-gym name, the keyword configuration it is built with, its share of a node's draws).
    Immutable."""

    swarm = models.ForeignKey(Swarm, on_delete=models.PROTECT, related_name="catalogues")
    version = models.PositiveIntegerField()
    entries = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    objects = SwarmCatalogueQuerySet.as_manager()

    class Meta:
        ordering = ["swarm", "-version"]
        constraints = [models.UniqueConstraint(fields=["swarm", "version"], name="swarms_catalogue_version_unique")]

    def __str__(self) -> str:
        return f"{self.swarm_id} v{self.version}"

    def save(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        if not self._state.adding:
            raise PermissionError("a catalogue version is never changed: write the next one")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # noqa: ANN002, ANN003
        raise PermissionError("a catalogue version is never deleted: groups name it")
