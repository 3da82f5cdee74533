"""Loading a policy: the built-in tiny models, or any causal LM by hub id or local path."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch

from sapo_node.packaged import PACKAGED, ensure_converted
from sapo_node.prebuilt import fetcher
from sapo_node.tiny.cache import load_tiny
from sapo_node.tiny.variants import VARIANTS

#: The paper's model; any hub id or local folder of a causal LM works the same way.
DEFAULT_HUB_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def resolve_device(device: str = "auto") -> str:
    """ "auto" picks cuda if present, else mps, else cpu; anything else is returned as given."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(device: str, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The given dtype ("bfloat16", "float32", ... or a torch.dtype); by default bf16 on a cuda
    device that supports it, float32 elsewhere (CPU kernels are fastest and exact in float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype:
        value = getattr(torch, str(dtype).removeprefix("torch."), None)
        if not isinstance(value, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        return value
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def prepare_tokenizer(tokenizer: Any) -> Any:
    """A pad token (the eos token if the model has none) and left padding, for batched generation."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(
    model: str,
    device: str = "auto",
    cache_dir: Path | str | None = None,
    dtype: str | torch.dtype | None = None,
    server: str | None = None,
) -> tuple[Any, Any, str]:
    """(model, tokenizer, device) for `model`: the built-in ones (sapo_node.tiny.variants.VARIANTS) are cached in
    `cache_dir`, downloaded on first use from `server` when that site serves them prebuilt
    (sapo_node.prebuilt), else built there, on `device`; a packaged one (sapo_node.packaged.PACKAGED) is
    converted into `cache_dir` on first use; anything else is a hub id or local folder for from_pretrained."""
    device = resolve_device(device)
    torch_dtype = resolve_dtype(device, dtype)
    if model in VARIANTS:
        fetch = fetcher(server, model) if server else None
        cache = Path(cache_dir) if cache_dir else None
        policy, tokenizer = load_tiny(model, cache_dir=cache, device=device, fetch=fetch)
        policy = policy.to(device=device, dtype=torch_dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        hub_cache = str(cache_dir) if cache_dir else None
        source = model
        if model in PACKAGED:  # shipped by a package: converted once into the node cache
            source, hub_cache = str(ensure_converted(model, Path(cache_dir) if cache_dir else None)), None
        tokenizer = AutoTokenizer.from_pretrained(source, cache_dir=hub_cache)
        policy = AutoModelForCausalLM.from_pretrained(source, cache_dir=hub_cache, dtype=torch_dtype).to(device)
    prepare_tokenizer(tokenizer)
    if policy.generation_config.pad_token_id is None:
        policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.eval()
    return policy, tokenizer, device


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe_hardware(device: str = "auto") -> str:
    """A short line for the hello message, e.g. "cpu x2, 24 GiB" or "cuda: NVIDIA H100 80GB HBM3, 79 GiB"."""
    device = resolve_device(device)
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        count = torch.cuda.device_count()
        return f"cuda: {props.name}, {props.total_memory / 2**30:.0f} GiB" + (f" (x{count})" if count > 1 else "")
    if device == "mps":
        return f"mps: Apple {platform.machine()}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = _memory_bytes()
    return f"cpu x{cores}" + (f", {memory / 2**30:.0f} GiB" if memory else "")
