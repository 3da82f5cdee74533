"""One build of a built-in model: tokenizer, network and warm start, with what the build measured."""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from sapo_node.tiny.batches import default_workers
from sapo_node.tiny.model import build_model, count_params
from sapo_node.tiny.recipe import recipe
from sapo_node.tiny.tokenizer import train_tokenizer
from sapo_node.tiny.variants import get_variant
from sapo_node.tiny.warm_start import known_catalogue, warm_start


def build_tiny(
    variant: str = "tiny",
    seed: int = 0,
    steps: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    workers: int | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    """Train the tokenizer, build the model and warm-start it (on `device`, in bfloat16 autocast on
    CUDA; entries built in `workers` processes, default_workers(device) when None), without touching
    the cache. The model comes back on the CPU in float32."""
    spec = get_variant(variant)
    steps = spec.steps if steps is None else steps
    started = time.perf_counter()
    tokenizer = train_tokenizer(spec)
    tokenizer_seconds = time.perf_counter() - started
    model = build_model(spec, tokenizer, seed).to(device)
    started = time.perf_counter()
    catalogue = known_catalogue(spec)
    workers = default_workers(device) if workers is None else workers
    loss = warm_start(
        model, tokenizer, spec, seed=seed, steps=steps, catalogue=catalogue, progress=progress, workers=workers
    )
    warm_seconds = time.perf_counter() - started
    if spec.format_steps:
        loss = warm_start(
            model,
            tokenizer,
            spec,
            seed=seed,
            steps=spec.format_steps,
            catalogue=catalogue,
            lr=spec.format_lr,
            bare_share=spec.bare_share,
            phase=1,
            progress=progress,
            workers=workers,
        )
    info = {
        "recipe": recipe(spec, seed, steps),
        "params": count_params(model),
        "vocab_size": len(tokenizer),
        "tokenizer_seconds": round(tokenizer_seconds, 3),
        "warm_start_seconds": round(warm_seconds, 2),
        "format_seconds": round(time.perf_counter() - started - warm_seconds, 2),
        "final_loss": round(loss, 4),
        "torch_threads": torch.get_num_threads(),
        "entry_workers": workers,
        "device": str(device),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return model.to("cpu"), tokenizer, info
