"""Fixtures of the node tests. Nothing here reaches the network: the Hugging Face hub is switched
offline, and the built-in tiny model is built locally.

The tiny model is built once per cache folder (about a minute on 2 cores) and reused by every
later test run: <repo>/var/test-cache, or $SAPO_TEST_CACHE.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if "huggingface_hub.constants" in sys.modules:  # imported before this file: switch it off too
    sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_cache_dir() -> Path:
    """The cache folder shared by the whole test run (and kept between runs)."""
    path = Path(os.environ.get("SAPO_TEST_CACHE") or REPO / "var" / "test-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_policy(tiny_cache_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of the built-in "tiny" variant, warm-started, in eval mode.

    Shared by the whole session: a test that trains or otherwise changes it must use
    `tiny_policy_copy` instead.
    """
    from sapo_node.tiny import load_tiny

    return load_tiny("tiny", cache_dir=tiny_cache_dir, progress=False)


@pytest.fixture
def tiny_policy_copy(tiny_policy: tuple[Any, Any]) -> tuple[Any, Any]:
    """A private deep copy of `tiny_policy` that a test may train."""
    model, tokenizer = tiny_policy
    return copy.deepcopy(model), copy.deepcopy(tokenizer)
