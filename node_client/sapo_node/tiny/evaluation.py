"""Held-out evaluation: a model's answers to, and mean score on, questions of a dataset seed no
warm start and no node trains on."""

from __future__ import annotations

from typing import Any

import torch

from sapo_node import protocol
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE, Catalogue, TaskSpec, build_entries, score_completion
from sapo_node.tiny.generation import generate_texts

#: The held-out dataset seed, the site's live checks' too (docs/protocol.md, "heldout_check"): no warm
#: start (sapo_node.tiny.warm_start.TRAIN_SEED + seed) and no node's stream draws from it.
EVAL_SEED = protocol.HELDOUT_SEED


def heldout_answers(
    model: Any,
    tokenizer: Any,
    spec: TaskSpec,
    *,
    n: int,
    seed: int = EVAL_SEED,
    temperature: float = 0.0,
    max_new_tokens: int = 24,
    batch: int = 0,
    few_shot: bool = True,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Questions 0..n-1 of `spec` at dataset seed `seed` and the model's completions with the node's
    prompt (`few_shot` False: without its worked turns), `batch` prompts per generation (0: all n)."""
    entries = build_entries(spec, seed, n)
    step = batch or max(n, 1)
    texts: list[str] = []
    for at in range(0, n, step):
        prompts = [format_prompt(tokenizer, e["question"], few_shot=few_shot) for e in entries[at : at + step]]
        texts += generate_texts(model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature)
    return entries, texts


def evaluate(
    model: Any,
    tokenizer: Any,
    *,
    catalogue: Catalogue = EASY_CATALOGUE,
    n: int = 64,
    seed: int = EVAL_SEED,
    temperature: float = 0.0,
    max_new_tokens: int = 24,
) -> dict[str, float]:
    """Mean score per dataset on questions 0..n-1 of dataset seed `seed` (held out from the warm start)."""
    torch.manual_seed(seed)
    scores = {}
    for spec in catalogue.tasks:
        entries, completions = heldout_answers(
            model, tokenizer, spec, n=n, seed=seed, temperature=temperature, max_new_tokens=max_new_tokens
        )
        scores[spec.dataset] = (
            sum(score_completion(spec, seed, e, c) for e, c in zip(entries, completions, strict=True)) / n
        )
    return scores
