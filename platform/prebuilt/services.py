"""Publishing the built-in models: build each once with the nodes' own builder (sapo_node.tiny.cache.load_tiny,
seed 0, into settings.SAPO_PREBUILT_DIR, laid out as a node cache), then write the manifest that
lists every finished folder of a current recipe with its files' sizes and sha256."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import msgspec
from filelock import FileLock

from prebuilt.selectors import manifest_path, prebuilt_dir
from sapo_node import prebuilt


def models_publish(*, names: Sequence[str], from_cache: Path | None = None, progress: bool = True) -> prebuilt.Manifest:
    """Build (or, with `from_cache`, copy from a node cache holding the same recipe's finished build)
    each model of `names` missing from the site's folder, then write the manifest."""
    from sapo_node.tiny.cache import load_tiny, tiny_path
    from sapo_node.tiny.variants import get_variant

    folder = prebuilt_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        get_variant(name)  # an unknown name fails before any build
    for name in names:
        fetch = None
        if from_cache is not None:
            source = tiny_path(name, from_cache)
            fetch = lambda path, source=source: _copy_build(source, path)  # noqa: E731
        load_tiny(name, cache_dir=folder, progress=progress, fetch=fetch)
    return manifest_write()


def _copy_build(source: Path, path: Path) -> bool:
    """Copy a finished build at `source` to `path` (its recipe digest names both folders); False if
    there is none. Caller holds `path`'s lock."""
    from sapo_node.tiny.cache import build_info, staging_dir

    if build_info(source) is None:
        return False
    staging = staging_dir(path)
    try:
        for item in source.iterdir():
            if item.is_file():
                shutil.copyfile(item, staging / item.name)
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def manifest_write() -> prebuilt.Manifest:
    """List every finished model folder of a current recipe (seed 0, the variants' own steps) and
    write the manifest in its place at once. Serialised on a lock: publishers of different models
    running side by side each list what all have finished."""
    from sapo_node.tiny.cache import build_info, tiny_path
    from sapo_node.tiny.recipe import recipe_digest
    from sapo_node.tiny.variants import VARIANTS

    folder = prebuilt_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = manifest_path()
    with FileLock(str(path) + ".lock"):
        models = [
            prebuilt.describe_folder(name, recipe_digest(name), tiny_path(name, folder))
            for name in sorted(VARIANTS)
            if build_info(tiny_path(name, folder)) is not None
        ]
        manifest = prebuilt.Manifest(format=prebuilt.MANIFEST_FORMAT, models=models)
        fd, staging = tempfile.mkstemp(dir=folder, prefix=".manifest-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(msgspec.json.format(msgspec.json.encode(manifest), indent=2))
            os.chmod(staging, 0o644)
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.unlink(staging)
    return manifest
