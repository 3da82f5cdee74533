"""The warm start: supervised fine-tuning on (question, answer) pairs, so a built-in model starts
with partial accuracy (GRPO learns nothing from groups that all fail or all succeed)."""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from transformers import Qwen2ForCausalLM

from sapo_node.progress import progress_bar
from sapo_node.tasks import CATALOGUES, EASY_CATALOGUE, Catalogue, build_entries
from sapo_node.tiny.batches import batch_builder, batch_draws, supervised_batch
from sapo_node.tiny.variants import TinyVariant

#: The warm start draws from dataset seed TRAIN_SEED + seed; evaluation holds out another
#: (sapo_node.tiny.evaluation.EVAL_SEED).
TRAIN_SEED = 1000


def known_catalogue(variant: TinyVariant) -> Catalogue:
    """The part of its catalogue `variant`'s warm start teaches."""
    catalogue = CATALOGUES[variant.catalogue]
    if not variant.known:
        return catalogue
    tasks = tuple(spec for spec in catalogue.tasks if spec.dataset in variant.known)
    if len(tasks) != len(variant.known):
        raise ValueError(f"variant {variant.name}: {variant.known} is not a subset of catalogue {catalogue.name}")
    return Catalogue(name=f"{catalogue.name}:{'+'.join(variant.known)}", tasks=tasks)


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: Any,
    variant: TinyVariant,
    *,
    seed: int,
    steps: int,
    catalogue: Catalogue = EASY_CATALOGUE,
    lr: float | None = None,
    bare_share: float = 0.0,
    phase: int = 0,
    progress: bool = True,
    workers: int = 0,
) -> float:
    """Supervised fine-tuning on (question, answer) pairs of `catalogue`; returns the final loss (EMA).

    Each step's batch comes from one dataset, in turn: questions of one dataset have similar
    lengths, so little compute goes to padding (the long base-conversion prompts would otherwise
    set the width of every batch). A share `bare_share` of the targets (drawn per example) is the
    bare answer without tags. `phase` > 0 draws from its own question stream (the format phase).

    `workers` > 0 builds the batches' entries in that many processes, ahead of the training steps
    (reasoning-gym's generators, not the model, set the pace of a build on a GPU); the batches are
    the same as with none: every draw is made here, in order, and a worker only rebuilds entries.
    """
    rng = random.Random(TRAIN_SEED + seed + 7919 * phase)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=variant.lr if lr is None else lr, betas=(0.9, 0.95), weight_decay=0.01
    )
    warmup = max(1, steps // 10)

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to a tenth
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    # Tasks without a single answer (propositional_logic) have no target to imitate.
    tasks = [spec for spec in catalogue.tasks if build_entries(spec, TRAIN_SEED + seed, 1)[0]["answer"] is not None]
    draws = batch_draws(tasks, TRAIN_SEED + seed, rng, steps, variant.batch_size, bare_share)
    model.train()
    ema = float("nan")
    bar = progress_bar(total=steps, desc=f"warm start {variant.name}", unit="step", disable=not progress, leave=False)
    with batch_builder(workers) as build:
        for entries, bare in build(draws):
            input_ids, attention_mask, labels = (t.to(model.device) for t in supervised_batch(tokenizer, entries, bare))
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=model.device.type == "cuda"):
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            ema = loss.item() if math.isnan(ema) else 0.9 * ema + 0.1 * loss.item()
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}")
    bar.close()
    model.eval()
    return ema
