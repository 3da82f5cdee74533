"""Batched generation: B prompts x G completions in as few generate calls as asked."""

from __future__ import annotations

import torch
from node_toys import make_policy

from sapo_node.generate import generate_completions


def test_generation_is_batched_and_completions_end_at_eos(monkeypatch):
    model, tok = make_policy("a")
    calls = []
    real = model.generate

    def counting_generate(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counting_generate)
    torch.manual_seed(0)
    prompts = ["Question: What is 1 + 2?\nAnswer:", "Question: Is 2024 a leap year?\nAnswer:", "Question: hi\nAnswer:"]
    groups = generate_completions(model, tok, prompts, generations=4, max_new_tokens=8, temperature=1.0)
    assert calls == [12]  # one call for all B*G rows
    assert len(groups) == 3 and all(len(g.completion_ids) == 4 == len(g.texts) for g in groups)
    for g in groups:
        assert g.prompt_ids == tok(prompts[groups.index(g)])["input_ids"]
        for ids, truncated in zip(g.completion_ids, g.truncated, strict=True):
            if truncated:
                assert len(ids) == 8 and tok.eos_token_id not in ids
            else:
                assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
            assert tok.pad_token_id not in ids

    calls.clear()
    generate_completions(model, tok, prompts, generations=4, max_new_tokens=8, temperature=1.0, batch_size=5)
    assert calls == [5, 5, 2]
