"""Step 2 of a round: G completions for each of B prompts, in batched generate calls.

All B*G sequences go through `model.generate` together (or in chunks of `batch_size` rows), left
padded, sampled at `temperature` from the policy itself (no top-k/top-p, so the samples follow the
distribution the GRPO loss assumes). The incumbent demo called generate once per completion.

Per-token log-probabilities are not collected here: keeping generate's logits costs B*G*T*V floats
(about 10 GB for Qwen's vocabulary at B=G=8, T=256), while the update's first forward pass yields
exactly the log-probs of the policy before the update for free (sapo_node.grpo).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sapo_node.prompts import has_chat_template


@dataclass
class Generated:
    """The G completions of one prompt, as token ids (ending in EOS when the model stopped) and text."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    truncated: list[bool]

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.completion_ids)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a formatted prompt. A chat template already holds its special tokens."""
    return list(tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"])


def stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a completion: the tokenizer's EOS and the model's generation EOS ids."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def generate_completions(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    generations: int,
    max_new_tokens: int,
    temperature: float,
    batch_size: int = 0,
) -> list[Generated]:
    """`generations` sampled completions for each prompt; batch_size 0 = all rows in one call."""
    device = next(model.parameters()).device
    prompt_ids = [encode_prompt(tokenizer, p) for p in prompts]
    rows = [ids for ids in prompt_ids for _ in range(generations)]  # B*G rows, prompt-major
    step = batch_size if batch_size > 0 else len(rows)
    stops, pad = stop_ids(model, tokenizer), pad_id(tokenizer)
    model.eval()

    completions: list[list[int]] = []
    truncated: list[bool] = []
    for start in range(0, len(rows), step):
        chunk = rows[start : start + step]
        width = max(len(ids) for ids in chunk)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in chunk], device=device)  # (N, P)
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
        output = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=sorted(stops) or None,
        )  # (N, P + T)
        for row in output[:, width:].tolist():
            ids, ended = _cut_at_stop(row, stops)
            completions.append(ids)
            truncated.append(not ended)

    groups = []
    for b, ids in enumerate(prompt_ids):
        rows_b = slice(b * generations, (b + 1) * generations)
        comp = completions[rows_b]
        texts = [tokenizer.decode([t for t in c if t not in stops], skip_special_tokens=True) for c in comp]
        groups.append(Generated(ids, comp, texts, truncated[rows_b]))
    return groups


def _cut_at_stop(row: list[int], stops: set[int]) -> tuple[list[int], bool]:
    """The ids up to and including the first stop id (padding after it dropped)."""
    for i, token in enumerate(row):
        if token in stops:
            return row[: i + 1], True
    return row, False
