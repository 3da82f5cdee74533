"""Reading settings from the environment: one small helper per type, used by config/settings.py."""

from __future__ import annotations

import os
from urllib.parse import parse_qsl, unquote, urlsplit

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(RuntimeError):
    """A variable is missing or cannot be parsed; raised at start-up, never at request time."""


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise EnvError(f"{name}={value!r} is not an integer") from exc


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise EnvError(f"{name}={value!r} is not a number") from exc


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    """A comma-separated list; blanks are dropped."""
    value = os.environ.get(name)
    if value is None:
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_database_url(url: str) -> dict:
    """Turn `postgresql://user:pass@host:port/name?opt=v` into a Django DATABASES entry (psycopg 3).

    Only PostgreSQL is accepted: the project relies on its behaviour (row locks, JSONB, constraints).
    A `host=` query option (a Unix socket directory) overrides the network location.
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise EnvError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parts.scheme!r}")
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or unquote(parts.hostname or "")
    return {
        "ENGINE": "config.pg_backend",  # Django's, its pool checking what it hands out
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }
