"""System checks on how the site is deployed (`manage.py check --deploy`, also run by migrate)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.checks import Warning, register


@register("ops")  # not "staticfiles": collectstatic runs those checks before it collects
def static_files_collected(app_configs, **kwargs) -> list[Warning]:
    """In production static files come from STATIC_ROOT through the manifest that `collectstatic`
    writes; without it every page that links a stylesheet fails with a 500."""
    backend = settings.STORAGES["staticfiles"]["BACKEND"]
    if "Manifest" not in backend or settings.DEBUG:
        return []
    manifest = Path(settings.STATIC_ROOT) / "staticfiles.json"
    if manifest.exists():
        return []
    return [
        Warning(
            f"Static files are not collected: {manifest} is missing, so every page will answer 500.",
            hint="Run `python manage.py collectstatic --noinput` (the Docker image does it at build time; "
            "see docs/deploy.md).",
            id="ops.W001",
        )
    ]


@register("ops")
def native_extension(app_configs, **kwargs) -> list[Warning]:
    """Without the C extension a share's per-item loops run their Python and numpy twins: correct, but
    at more CPU per share (docs/benchmarks.md)."""
    from common import native

    if native.sapo_native is not None or not settings.SAPO_NATIVE:
        return []
    return [
        Warning(
            "The sapo_native C extension is not installed: a share's per-item loops (the moderation rules' "
            "text work, the statements' arrays) run in Python and numpy, at more CPU per share.",
            hint="pip install ./native (a C compiler and Python's headers; `make venv` and the Docker image "
            "do it), or set SAPO_NATIVE=0 to silence this on purpose.",
            id="ops.W002",
        )
    ]


@register("ops", deploy=True)
def metrics_token(app_configs, **kwargs) -> list[Warning]:
    """In production /metrics answers anyone who asks unless SAPO_METRICS_TOKEN is set: its counters
    (sockets, shares, refusals) are the site's load and traffic, which an attacker times attacks by."""
    if not settings.PRODUCTION or settings.SAPO_METRICS_TOKEN:
        return []
    return [
        Warning(
            "SAPO_METRICS_TOKEN is not set: /metrics answers anyone.",
            hint="Set SAPO_METRICS_TOKEN and give the scraper `Authorization: Bearer <token>` (docs/deploy.md, "
            "Metrics), or block /metrics at the proxy.",
            id="ops.W003",
        )
    ]


@register("ops")
def library_patches_apply(app_configs, **kwargs) -> list[Warning]:
    """The server changes a few libraries' private internals (common.library_patches); an upgrade that
    moves what one changes leaves the server on the library's own path, slower or wrong."""
    from common import library_patches

    return [
        Warning(
            f"A library upgrade moved what the server patches, so the library's own path runs: {what}.",
            hint="Pin the library to the version in requirements/lock.txt, or move the patch in "
            "common/library_patches with it (tests/platform/test_library_patches.py says what moved).",
            id="ops.W004",
        )
        for what in library_patches.moved()
    ]


@register("ops")
def retention_archive(app_configs, **kwargs) -> list[Warning]:
    """Without an archive folder, and dropping unarchived texts not allowed, the retention keeps every
    text: nothing is lost, but the texts' table grows without bound (docs/deploy.md, "Text retention and
    archives")."""
    from pool.retention import retention_plan

    if settings.SAPO_ARCHIVE_DIR or settings.SAPO_RETENTION_UNARCHIVED == "drop":
        return []
    return [
        Warning(
            f"{retention_plan()}: the texts' table grows without bound.",
            hint="Set SAPO_ARCHIVE_DIR to a folder (unset, it is <SAPO_VAR_DIR>/archive) to archive, then drop, "
            "or SAPO_RETENTION_UNARCHIVED=drop to drop the texts without an archive.",
            id="ops.W005",
        )
    ]
