"""`manage.py sapo_models`: the site's prebuilt models, built (here: copied from a node cache of the
same recipe) once, listed in a manifest with every file's size and sha256."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from django.core.management import CommandError, call_command

from sapo_node.tiny.cache import load_tiny, tiny_path
from sapo_node.tiny.recipe import recipe_digest


def test_build_publishes_once_and_lists_every_file(settings, tmp_path, tiny_cache_dir):
    load_tiny("tiny-mini", cache_dir=tiny_cache_dir, progress=False)
    settings.SAPO_PREBUILT_DIR = tmp_path / "models"
    out = io.StringIO()
    call_command("sapo_models", "build", "--models", "tiny-mini", "--from-cache", str(tiny_cache_dir), stdout=out)
    folder = tiny_path("tiny-mini", tmp_path / "models")
    assert f"tiny-mini: {folder.name}, 6 files" in out.getvalue()
    manifest = json.loads((tmp_path / "models" / "manifest.json").read_text())
    (entry,) = manifest["models"]
    assert (manifest["format"], entry["name"], entry["recipe"]) == (1, "tiny-mini", recipe_digest("tiny-mini"))
    assert {f["name"]: (f["size"], f["sha256"]) for f in entry["files"]} == {
        p.name: (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in folder.iterdir()
    }
    source = tiny_path("tiny-mini", tiny_cache_dir)
    assert all((folder / p.name).read_bytes() == p.read_bytes() for p in source.iterdir())  # the same build
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    call_command("sapo_models", "build", "--models", "tiny-mini", stdout=io.StringIO())  # no cache: none needed
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # published once
    listed = io.StringIO()
    call_command("sapo_models", "list", stdout=listed)
    assert listed.getvalue().startswith(f"tiny-mini: {folder.name}, 6 files, 3.7 MB")


def test_unknown_models_and_an_empty_site_are_refused(settings, tmp_path):
    settings.SAPO_PREBUILT_DIR = tmp_path / "models"
    with pytest.raises(CommandError, match="not a built-in model: gpt-5"):
        call_command("sapo_models", "build", "--models", "tiny-mini,gpt-5")
    with pytest.raises(CommandError, match="nothing published"):
        call_command("sapo_models", "list")
    assert not (tmp_path / "models").exists()
