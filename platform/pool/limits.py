"""The protocol's limits and the pool's catalogue, read from the environment.

Every limit has an environment variable (docs/protocol.md, "Limits"); `settings.SAPO_LIMITS`, a dict
of the same names, overrides them (tests use it). Values are read when a connection opens, so a
change applies to new connections.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from common.env import env_int
from sapo_node.tasks import CATALOGUES, Catalogue


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int = 1_048_576
    max_groups_per_message: int = 64
    max_completions_per_group: int = 32
    max_chars_per_completion: int = 8192
    max_sample_n: int = 64
    max_used_per_report: int = 1024
    max_messages_per_minute: int = 600
    max_consecutive_errors: int = 20
    sample_window_seconds: int = 86_400

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def current_limits() -> Limits:
    """The limits in force: defaults, then SAPO_<NAME> environment variables, then settings.SAPO_LIMITS."""
    overrides: dict[str, Any] = getattr(settings, "SAPO_LIMITS", None) or {}
    values = {}
    for f in fields(Limits):
        value = env_int("SAPO_" + f.name.upper(), f.default)
        value = int(overrides.get(f.name, value))
        if value < 1:
            raise ImproperlyConfigured(f"limit {f.name} must be at least 1, got {value}")
        values[f.name] = value
    return Limits(**values)


def current_catalogue() -> Catalogue:
    """This deployment's catalogue: settings.SAPO_CATALOGUE or the SAPO_CATALOGUE variable ("sapo" by default)."""
    name = getattr(settings, "SAPO_CATALOGUE", None) or os.environ.get("SAPO_CATALOGUE") or "sapo"
    try:
        return CATALOGUES[name]
    except KeyError as exc:
        raise ImproperlyConfigured(f"SAPO_CATALOGUE={name!r}: choose one of {sorted(CATALOGUES)}") from exc
