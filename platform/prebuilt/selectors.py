"""Reads of the site's folder of prebuilt models (settings.SAPO_PREBUILT_DIR)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from sapo_node import prebuilt

MANIFEST = "manifest.json"

#: The parsed manifest, with the (mtime, size) it was read at: a publish replaces the file.
_read: tuple[tuple[int, int], prebuilt.Manifest] | None = None


def prebuilt_dir() -> Path:
    return Path(settings.SAPO_PREBUILT_DIR)


def manifest_path() -> Path:
    return prebuilt_dir() / MANIFEST


def manifest_get() -> prebuilt.Manifest | None:
    """The published manifest, or None when nothing is published (or the file is unreadable)."""
    global _read
    path = manifest_path()
    try:
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if _read is None or _read[0] != stamp:
            _read = (stamp, prebuilt.parse_manifest(path.read_bytes()))
    except (OSError, prebuilt.PrebuiltUnavailable):
        return None
    return _read[1]


def published_file(*, folder: str, name: str) -> tuple[Path, prebuilt.ManifestFile] | None:
    """The file `name` of the model folder `folder` and its manifest entry, when the manifest lists it."""
    manifest = manifest_get()
    if manifest is None:
        return None
    for model in manifest.models:
        if model.folder != folder:
            continue
        for listed in model.files:
            if listed.name == name:
                path = prebuilt_dir() / model.folder / listed.name
                return (path, listed) if path.is_file() else None
    return None
