"""Completion texts from prompts with the node's own sampler: the generator of every evaluation."""

from __future__ import annotations

from typing import Any

from sapo_node.generate import generate_groups


def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int = 24,
    temperature: float = 0.0,
    num_return_sequences: int = 1,
) -> list[str]:
    """Completion texts (special tokens dropped), prompt-major order: the evaluation's generator (the
    export's card, a study's held-out check, bench/answers.py) and the tests'.

    temperature 0 is greedy; otherwise plain sampling (no top-k/top-p), as the node samples. They come
    from the node's own sampler (`sapo_node.generate.generate_groups`) rather than transformers'
    `model.generate`: the prompts' shared start runs once and finished rows leave the batch, which
    gives the same completions in less time.
    """
    groups = generate_groups(
        model,
        tokenizer,
        prompts,
        generations=num_return_sequences,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
    )
    return [text for group in groups for text in group.texts]
