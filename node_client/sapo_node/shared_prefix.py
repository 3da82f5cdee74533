"""The prompts of a round begin alike: one forward pass for what they share.

A real instruct model's prompt is its chat template's system message and worked turns, then the
question (sapo_node.prompts): for SmolLM2-135M-Instruct 163 of a prompt's 177-201 tokens are the same
in every prompt. Generation (sapo_node.generate) and the update (sapo_node.grpo) already pass each
distinct prompt through the model once; here the distinct prompts' longest common prefix goes
through it once too, as one row, its key/value cache is copied to every prompt's row, and then only
each prompt's own tokens are run, on top of it.

The layout that makes this one batch: each prompt is its shared prefix, then padding, then its own
tokens (`prompt_layout`), with an attention mask that is 0 on the padding and positions that count
only real tokens, so every real token sits at the position, and attends to the tokens, it would have
in its prompt alone (tests/node/test_generate.py, tests/node/test_grpo.py compare both passes
against a model run on each sequence whole). With no prefix worth sharing (the built-in models'
plain prompts share "Question:"), the layout is the usual left padding and the pass one call. A
prompt's completions then run on copies of its key/value cache (`completion_hidden`): the update
and the audit's replay score G completions behind one prompt pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

#: Fewest shared leading tokens worth a pass of their own: below this, running them in every
#: prompt's row costs about what the extra call does.
MIN_SHARED_PREFIX = 16


def shared_prefix(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens all `prompts` share, when there are two or more and they share at
    least MIN_SHARED_PREFIX; otherwise 0. Every prompt keeps at least one token of its own: its last
    position's output predicts its first completion token, and comes from the prompt's own pass."""
    if len(prompts) < 2:
        return 0
    first, rest = prompts[0], prompts[1:]
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in rest):
        n += 1
    return n if n >= MIN_SHARED_PREFIX else 0


def prompt_layout(prompts: Sequence[Sequence[int]], pad: int, device: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(K, W) ids and attention mask of `prompts` as one batch, and their shared prefix's length L:
    each row is the prefix, padding, then the prompt's own tokens (L = 0: left padding)."""
    shared = shared_prefix(prompts)
    width = max(len(p) for p in prompts) - shared
    ids, mask = [], []
    for p in prompts:
        gap = width - (len(p) - shared)
        ids.append([*p[:shared], *[pad] * gap, *p[shared:]])
        mask.append([1] * shared + [0] * gap + [1] * (len(p) - shared))
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device), shared


def prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each token's position in its prompt: real tokens counted from 0, padding wherever (masked)."""
    return (mask.cumsum(dim=-1) - 1).clamp(min=0)


@lru_cache(maxsize=32)
def _cache_keyword(forward_type: type) -> str:
    parameters = inspect.signature(forward_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def with_cache(forward: Any, cache: Any) -> dict[str, Any]:
    """`{name: cache}` under the name `forward` (a model or its backbone) takes its key/value cache by:
    `cache` from transformers 5.24, where `past_key_values` still works but warns at every call site;
    `past_key_values` before, where `cache` would fall silently into **kwargs."""
    return {_cache_keyword(type(forward)): cache}


def returned_cache(out: Any) -> Any:
    """The key/value cache a forward returned: `out.cache` from transformers 5.24 (whose
    `out.past_key_values` warns), `out.past_key_values` before."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def prompt_pass(forward: Any, ids: torch.Tensor, mask: torch.Tensor, shared: int, **kwargs: Any) -> Any:
    """`forward` (a model or its backbone) over the prompts of `prompt_layout`, with a key/value cache
    of all W positions: the first `shared` columns once, as one row whose cache is then copied to the
    K rows (differentiably: gradients from every prompt flow back into the one pass), then the rest.
    `kwargs` go to both calls (e.g. logits_to_keep=1)."""
    positions = prompt_positions(mask)
    if not shared:
        return forward(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **kwargs)
    head = forward(input_ids=ids[:1, :shared], position_ids=positions[:1, :shared], use_cache=True, **kwargs)
    cache = returned_cache(head)
    cache.reorder_cache(torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device))
    return forward(
        input_ids=ids[:, shared:],
        attention_mask=mask,
        position_ids=positions[:, shared:],
        use_cache=True,
        **with_cache(forward, cache),
        **kwargs,
    )


def completion_hidden(
    forward: Any,
    out: Any,
    prompt_mask: torch.Tensor,
    owner: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> torch.Tensor:
    """(N, T, H): the hidden state each completion token is predicted from. `out` is `forward`'s (a
    backbone's) pass over K prompts ending in a real token (`prompt_pass`, or a plain call with
    use_cache=True; `prompt_mask` (K, P)); row i completes prompt owner[i] ((N,) long). Token 0 is
    predicted from its prompt's last position; tokens 0..T-2 then run as one batch on a copy of their
    prompt's keys/values per row (differentiable), at the positions that follow the prompt's.
    `completion_ids` (N, T) are right padded, `completion_mask` 0 on the padding, which no real token
    attends to. The cache in `out` is consumed."""
    hidden = out.last_hidden_state[:, -1][owner][:, None]  # (N, 1, H)
    t_len = completion_ids.shape[1]
    if t_len == 1:  # the last token is never an input
        return hidden
    cache = returned_cache(out)
    cache.reorder_cache(owner)
    inputs = completion_ids[:, :-1]  # (N, T - 1)
    mask = torch.cat([prompt_mask[owner], completion_mask[:, :-1]], dim=1)
    positions = prompt_mask.sum(dim=-1)[owner][:, None] + torch.arange(t_len - 1, device=inputs.device)
    rest = forward(
        input_ids=inputs, attention_mask=mask, position_ids=positions, use_cache=True, **with_cache(forward, cache)
    ).last_hidden_state  # (N, T - 1, H)
    return torch.cat([hidden, rest], dim=1)
