"""The cache of built-in models: one folder per recipe under <cache_dir>/<variant>-<recipe hash>/,
written whole or not at all, filled by a prebuilt download or a build, read back by `load_tiny`.
Two processes building the same recipe at once serialise on a file lock."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from sapo_node.tiny.build import build_tiny
from sapo_node.tiny.recipe import recipe_digest

#: The file that marks a finished build; it records the recipe and what the build measured.
BUILD_INFO = "build.json"


def default_cache_dir() -> Path:
    return Path(os.environ.get("SAPO_CACHE") or Path.home() / ".cache" / "sapo-node")


def tiny_path(variant: str = "tiny", cache_dir: Path | None = None, seed: int = 0, steps: int | None = None) -> Path:
    """Where `load_tiny` with these arguments keeps its model."""
    digest = recipe_digest(variant, seed, steps)[:12]
    return Path(cache_dir or default_cache_dir()) / f"{variant}-{digest}"


def build_info(path: Path) -> dict[str, Any] | None:
    """What a finished build recorded (recipe, params, timings), or None if there is none at `path`."""
    try:
        return json.loads((Path(path) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No "Loading weights" / "Writing model shards" bars for a model of a few megabytes."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def staging_dir(path: Path) -> Path:
    """A fresh folder beside `path` to write its model in before renaming it into place: a crash
    never leaves a half-written model that a later load would take for a finished one."""
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))


def drop_stale_staging(path: Path) -> None:
    """Remove what a killed build or download left beside `path`. Caller holds `path`'s lock, so no
    live writer owns any of them."""
    for stale in path.parent.glob(f".{path.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def load_tiny(
    variant: str = "tiny",
    cache_dir: Path | None = None,
    seed: int = 0,
    steps: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    fetch: Callable[[Path], bool] | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The built-in model `variant` and its tokenizer: read from the cache, else placed there by
    `fetch(path)` (a prebuilt copy: sapo_node.prebuilt; it returns False when it has none), else
    built (on `device`: the warm start of "small" wants a GPU).

    Deterministic in (variant, seed, steps) on one device. The model comes back in eval mode,
    float32, on the CPU.
    """
    path = tiny_path(variant, cache_dir, seed, steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"), quiet_transformers():
        if build_info(path) is None:
            drop_stale_staging(path)
        if build_info(path) is None and not (fetch is not None and fetch(path)):
            model, tokenizer, info = build_tiny(variant, seed, steps, progress, device)
            staging = staging_dir(path)
            try:
                model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
                (staging / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
                if path.exists():
                    shutil.rmtree(path)
                os.replace(staging, path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model.eval()
    return model, tokenizer
