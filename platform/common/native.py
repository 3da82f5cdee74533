"""The platform's per-item loops in C: the `sapo_native` extension (native/, built by `make venv` and
the Docker image) when it is installed and settings.SAPO_NATIVE is on (the default), else None. Every
caller keeps a Python or numpy twin with the same results (tests/platform/test_native.py), which runs
without it; ops.W002 warns at start-up when it is missing."""

from __future__ import annotations

from types import ModuleType

from django.conf import settings

try:
    import sapo_native
except ImportError:  # not built: the twins
    sapo_native = None


def native() -> ModuleType | None:
    """The C extension when it is installed and SAPO_NATIVE is on, else None."""
    return sapo_native if getattr(settings, "SAPO_NATIVE", True) else None
