"""Batched generation: each distinct prompt through the model once, rows sampled from the policy's
softmax with a KV cache, finished rows dropped; the same tokens as a plain no-cache sampler."""

from __future__ import annotations

import math

import pytest
import torch
from node_toys import make_policy

from sapo_node.generate import (
    encode_prompt,
    generate_groups,
    gumbel_noise,
    printable,
    refused_tokens,
    sample_tokens,
    stop_ids,
)
from sapo_node.prompts import format_prompt
from sapo_node.sample import sample_questions
from sapo_node.shared_prefix import MIN_SHARED_PREFIX, shared_prefix
from sapo_node.tasks import CATALOGUES, TaskStream

PROMPTS = ["Question: What is 1 + 2?\nAnswer:", "Question: Is 2024 a leap year?\nAnswer:", "Question: hi\nAnswer:"]


def _record_forward_shapes(monkeypatch, model):
    shapes = []
    real = model.forward

    def recording_forward(*args, **kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording_forward)
    return shapes


def test_each_prompt_is_encoded_once_and_completions_end_at_eos(monkeypatch):
    model, tok = make_policy("a")
    shapes = _record_forward_shapes(monkeypatch, model)
    torch.manual_seed(0)
    groups = generate_groups(model, tok, PROMPTS, generations=4, max_new_tokens=8, temperature=1.0)
    width = max(len(encode_prompt(tok, p)) for p in PROMPTS)
    assert shapes[0] == (3, width)  # the 3 distinct prompts, not the 12 rows
    assert all(rows <= 12 and length == 1 for rows, length in shapes[1:])  # then one token per running row
    assert len(shapes) <= 8  # the last sampled token needs no forward pass
    assert len(groups) == 3 and all(len(g.completion_ids) == 4 == len(g.texts) for g in groups)
    for prompt, g in zip(PROMPTS, groups, strict=True):
        assert g.prompt_ids == tok(prompt)["input_ids"]
        for ids, truncated in zip(g.completion_ids, g.truncated, strict=True):
            if truncated:
                assert len(ids) == 8 and tok.eos_token_id not in ids
            else:
                assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]  # nothing kept after it

    shapes.clear()
    generate_groups(model, tok, PROMPTS, generations=4, max_new_tokens=8, temperature=1.0, batch_size=5)
    # rows 0-4 continue prompts 0 and 1, rows 5-9 prompts 1 and 2, rows 10-11 prompt 2
    assert [rows for rows, length in shapes if length > 1] == [2, 2, 1]


def _plain_sampler(model, tokenizer, prompts, *, generations, max_new_tokens, temperature):
    """The definition, slowly: at each step every unfinished row's whole sequence goes through the
    model alone (no cache, no padding, no shared prompt), and its next token is argmax(logits /
    temperature + Gumbel noise) over the tokens not refused, with the noise drawn as generate_groups
    draws it."""
    stops = stop_ids(model, tokenizer)
    refused = refused_tokens(tokenizer, model.config.vocab_size, "cpu", stops)
    rows = [encode_prompt(tokenizer, p) for p in prompts for _ in range(generations)]
    out: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    for _ in range(max_new_tokens):
        noise = gumbel_noise((len(rows), model.config.vocab_size), "cpu")
        for i, prompt in enumerate(rows):
            if not done[i]:
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([prompt + out[i]])).logits[:, -1]
                out[i].append(int(sample_tokens(logits, noise[i : i + 1], temperature, refused)))
                done[i] = out[i][-1] in stops
        if all(done):
            break
    return out


def test_the_cached_batched_sampler_draws_the_tokens_of_a_plain_sampler(tiny_policy):
    model, tok = tiny_policy  # warm-started: its completions stop at different lengths, so rows drop out
    stream = TaskStream(CATALOGUES["easy"], seed=7)  # prompts of 58 and 27 tokens, answers of 8 and 10
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 2)]
    torch.manual_seed(11)
    groups = generate_groups(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8)
    torch.manual_seed(11)
    expected = _plain_sampler(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8)
    got = [ids for g in groups for ids in g.completion_ids]
    assert got == expected
    lengths = {len(ids) for ids in got}
    assert len(lengths) > 1 and not all(t for g in groups for t in g.truncated)  # rows did stop, at different steps


def test_what_the_prompts_share_goes_through_once_and_the_tokens_are_the_plain_sampler_s(tiny_policy, monkeypatch):
    model, tok = tiny_policy
    stream = TaskStream(CATALOGUES["easy"], seed=7)
    # A common beginning, as a chat model's system message and worked turns give every prompt.
    preamble = "Read the question twice, work it out step by step, then give the answer. "
    prompts = [format_prompt(tok, preamble + q.question) for q in sample_questions(stream, 3)]
    ids = [encode_prompt(tok, p) for p in prompts]
    shared = shared_prefix(ids)
    assert shared >= MIN_SHARED_PREFIX
    shapes = _record_forward_shapes(monkeypatch, model)
    torch.manual_seed(11)
    groups = generate_groups(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8)
    # The shared tokens as one row, then each prompt's own tokens, then one token per running row.
    assert shapes[:2] == [(1, shared), (3, max(map(len, ids)) - shared)]
    assert all(length == 1 for _, length in shapes[2:])
    torch.manual_seed(11)
    expected = _plain_sampler(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8)
    assert [c for g in groups for c in g.completion_ids] == expected
    assert [g.prompt_ids for g in groups] == ids


def test_sampling_follows_the_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -math.inf]])
    n, temperature = 40_000, 0.7
    torch.manual_seed(0)
    draws = sample_tokens(logits.expand(n, -1), gumbel_noise((n, 5), "cpu"), temperature)
    freq = torch.bincount(draws, minlength=5).double() / n
    expected = torch.softmax(logits[0].double() / temperature, dim=0)
    assert freq[4] == 0  # a -inf logit is never drawn
    # 5 standard errors of a binomial proportion: a wrong temperature or distribution fails by far more
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / n).sqrt() + 1e-12)


def _rows(groups):
    return [ids for g in groups for ids in g.completion_ids], [t for g in groups for t in g.truncated]


def test_the_static_path_draws_the_same_tokens_as_the_dropping_loop_greedy_and_sampled(tiny_policy):
    # The GPU's path (fixed shapes, stopped rows masked, one sync a round) run on the CPU, uncompiled.
    model, tok = tiny_policy
    stream = TaskStream(CATALOGUES["easy"], seed=7)
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 3)]
    for temperature in (0.0, 0.8):
        results = []
        for static in (False, True):
            torch.manual_seed(11)
            results.append(
                _rows(
                    generate_groups(
                        model,
                        tok,
                        prompts,
                        generations=4,
                        max_new_tokens=16,
                        temperature=temperature,
                        static=static,
                        compile=None,
                    )
                )
            )
        assert results[0] == results[1]
        ids, truncated = results[1]
        if temperature:
            assert len({len(r) for r in ids}) > 1 and not all(truncated)  # rows stopped at different steps


def test_the_static_decode_step_compiles_into_one_graph_with_no_break():
    # fullgraph=True raises on any graph break: what CUDA graph capture needs. Traced on the CPU with
    # the eager backend (no compiler); a second round of the same shape reuses the graph.
    import torch._dynamo

    model, tok = make_policy("a")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    results = []
    for compile in (None, "eager", "eager"):
        torch.manual_seed(3)
        results.append(
            _rows(
                generate_groups(
                    model, tok, PROMPTS, generations=4, max_new_tokens=6, temperature=1.0, static=True, compile=compile
                )
            )
        )
    assert results[0] == results[1] == results[2]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.parametrize("variant", ["tiny", "tiny-mini"])
def test_the_built_in_models_never_write_a_character_the_pool_refuses(variant, tiny_policy, tiny_mini_policy):
    """768 completions of each built-in model, at the node's temperature and at 2 (a policy whose
    softmax has flattened: without the mask 24% (tiny) and 41% (tiny-mini) of them held a control
    character, NUL or a byte fragment's U+FFFD)."""
    model, tok = tiny_policy if variant == "tiny" else tiny_mini_policy
    stream = TaskStream(CATALOGUES["easy"], seed=3)
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 24)]
    texts = []
    torch.manual_seed(5)
    for temperature in (1.0, 2.0, 2.0, 2.0):
        groups = generate_groups(model, tok, prompts, generations=8, max_new_tokens=48, temperature=temperature)
        texts += [t for g in groups for t in g.texts]
    assert len(texts) == 768
    bad = [t for t in texts if not printable(t)]
    assert not bad, f"{len(bad)} completions hold refused characters, e.g. {bad[0]!r}"
    assert not any("\x00" in t or "\ufffd" in t for t in texts)


def test_the_refused_tokens_are_the_control_bytes_and_fragments_never_the_stops(tiny_policy):
    model, tok = tiny_policy
    stops = stop_ids(model, tok)
    refused = refused_tokens(tok, model.config.vocab_size, "cpu", stops)
    texts = tok.batch_decode([[i] for i in range(len(tok))], skip_special_tokens=True)
    assert [i for i, t in enumerate(texts) if refused[i]] == [i for i, t in enumerate(texts) if not printable(t)]
    assert not refused[sorted(stops)].any() and not refused[tok.encode("\n<answer>42")].any()
    nul = tok.encode("\x00")
    assert len(nul) == 1 and refused[nul[0]]
    assert int(refused.sum()) >= 31 + 1 + 128  # C0 controls but tab, newline, CR; DEL; the lone high bytes
    # A drawn row never takes a refused token, even where it has the largest logit.
    logits = torch.zeros((2, model.config.vocab_size))
    logits[:, nul[0]] = 100.0
    assert (sample_tokens(logits, None, 0.0, refused) != nul[0]).all()
    assert (sample_tokens(logits, gumbel_noise(logits.shape, "cpu"), 1.0, refused) != nul[0]).all()


def test_printable_refuses_what_moderation_counts_as_non_printable_and_unstorable_text():
    assert printable("Answer:\t<answer>3 × 4 = 12 — é</answer>\r\n")
    for c in ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\u200b", "\u202e", "\ufeff", "\ud800", "\udfff", "\ufffd"]:
        assert not printable(f"ok{c}ok"), repr(c)
