"""Batched generation: each distinct prompt through the model once, rows sampled from the policy's
softmax with a KV cache, finished rows dropped; each row drawn from its own key's stream, the same
tokens and log-probabilities as a plain no-cache sampler of the definition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from node_toys import make_policy

from sapo_node import proof
from sapo_node.generate import (
    encode_prompt,
    generate_groups,
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


def _keys(prompts, generations, tag=b"t"):
    return [[proof.completion_key("c", tag.decode(), 0, b, k) for k in range(generations)] for b in range(len(prompts))]


def _draw(logits, u, temperature, refused):
    """The sampler's definition for one row, in numpy: p = softmax(logits / temperature) in float32
    with the refused tokens at -inf, cdf = cumsum(p) in float64, the first id whose cdf exceeds
    u * cdf[-1]; and log p[token]. temperature 0: the argmax, log p at temperature 1."""
    x = logits.float().masked_fill(refused, -torch.inf)
    if temperature == 0:
        token = int(torch.argmax(x))
        return token, float(torch.log_softmax(x, -1)[token])
    p = torch.softmax(x / temperature, -1).numpy()
    cdf = np.cumsum(p.astype(np.float64))
    token = int(np.nonzero(cdf > u * cdf[-1])[0][0])
    return token, float(torch.log_softmax(x / temperature, -1)[token])


def _plain_sampler(model, tokenizer, prompts, keys, *, max_new_tokens, temperature):
    """The definition, slowly: each row alone, its whole sequence through the model at every step (no
    cache, no padding, no shared prompt, no other row), its token t drawn with its key's draw t."""
    stops = stop_ids(model, tokenizer)
    refused = refused_tokens(tokenizer, model.config.vocab_size, "cpu", stops)
    out, logprobs = [], []
    for b, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt)
        for key in keys[b]:
            u = proof.uniforms(key, max_new_tokens)
            row, lps = [], []
            for t in range(max_new_tokens):
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([ids + row])).logits[0, -1]
                token, lp = _draw(logits, u[t], temperature, refused)
                row.append(token)
                lps.append(lp)
                if token in stops:
                    break
            out.append(row)
            logprobs.append(lps)
    return out, logprobs


def test_the_cached_batched_sampler_draws_the_tokens_of_a_plain_sampler(tiny_policy):
    model, tok = tiny_policy  # warm-started: its completions stop at different lengths, so rows drop out
    stream = TaskStream(CATALOGUES["easy"], seed=7)  # prompts of 58 and 27 tokens, answers of 8 and 10
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 2)]
    keys = _keys(prompts, 3)
    groups = generate_groups(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8, keys=keys)
    expected, expected_logprobs = _plain_sampler(model, tok, prompts, keys, max_new_tokens=16, temperature=0.8)
    got = [ids for g in groups for ids in g.completion_ids]
    assert got == expected
    logprobs = [lp for g in groups for lp in g.logprobs]
    assert [len(lp) for lp in logprobs] == [len(ids) for ids in got]  # one per token, the stop included
    assert np.allclose(np.concatenate(logprobs), np.concatenate(expected_logprobs), atol=1e-5)
    assert [g.keys for g in groups] == keys
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
    keys = _keys(prompts, 3)
    groups = generate_groups(model, tok, prompts, generations=3, max_new_tokens=16, temperature=0.8, keys=keys)
    # The shared tokens as one row, then each prompt's own tokens, then one token per running row.
    assert shapes[:2] == [(1, shared), (3, max(map(len, ids)) - shared)]
    assert all(length == 1 for _, length in shapes[2:])
    monkeypatch.undo()
    expected, _ = _plain_sampler(model, tok, prompts, keys, max_new_tokens=16, temperature=0.8)
    assert [c for g in groups for c in g.completion_ids] == expected
    assert [g.prompt_ids for g in groups] == ids


def test_sampling_follows_the_softmax_at_the_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -math.inf]])
    n, temperature = 40_000, 0.7
    u = torch.tensor(proof.uniforms(b"one stream", n), dtype=torch.float64)
    draws, logprobs = sample_tokens(logits.expand(n, -1), u, temperature)
    freq = torch.bincount(draws, minlength=5).double() / n
    expected = torch.softmax(logits[0].double() / temperature, dim=0)
    assert freq[4] == 0  # a -inf logit is never drawn
    # 5 standard errors of a binomial proportion: a wrong temperature or distribution fails by far more
    assert torch.all((freq - expected).abs() <= 5 * (expected * (1 - expected) / n).sqrt() + 1e-12)
    assert torch.allclose(logprobs.double(), expected.log()[draws], atol=1e-6)
    # The inverse CDF in token-id order: u below p0 draws 0, just past p0 draws 1, near 1 the last id.
    p0 = float(expected[0])
    edges = torch.tensor([0.0, p0 * 0.999, p0 * 1.001, 1 - 2**-53], dtype=torch.float64)
    assert sample_tokens(logits.expand(4, -1), edges, temperature)[0].tolist() == [0, 0, 1, 3]
    # Greedy: the argmax, its log-probability at temperature 1.
    ids, lp = sample_tokens(logits, None, 0.0)
    assert ids.tolist() == [0] and math.isclose(float(lp), float(torch.log_softmax(logits[0], 0)[0]), abs_tol=1e-6)


def test_a_row_s_tokens_depend_on_its_key_alone_not_on_its_batch(tiny_policy):
    model, tok = tiny_policy
    stream = TaskStream(CATALOGUES["easy"], seed=7)
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 3)]
    keys = _keys(prompts, 4)
    together = generate_groups(model, tok, prompts, generations=4, max_new_tokens=16, temperature=1.0, keys=keys)
    again = generate_groups(model, tok, prompts, generations=4, max_new_tokens=16, temperature=1.0, keys=keys)
    assert [g.completion_ids for g in again] == [g.completion_ids for g in together]
    # Each completion alone, and inside other batches (other rows, other prompts, split in chunks of 3).
    for b, k in [(0, 0), (1, 2), (2, 3)]:
        alone = generate_groups(
            model, tok, [prompts[b]], generations=1, max_new_tokens=16, temperature=1.0, keys=[[keys[b][k]]]
        )
        assert alone[0].completion_ids[0] == together[b].completion_ids[k]
        assert np.allclose(alone[0].logprobs[0], together[b].logprobs[k], atol=1e-5)
    split = generate_groups(
        model, tok, prompts[::-1], generations=4, max_new_tokens=16, temperature=1.0, keys=keys[::-1], batch_size=3
    )
    assert [g.completion_ids for g in split] == [g.completion_ids for g in together][::-1]
    # Another key draws other tokens; no key draws a fresh random one per completion.
    other = generate_groups(
        model, tok, prompts, generations=4, max_new_tokens=16, temperature=1.0, keys=_keys(prompts, 4, b"u")
    )
    assert [g.completion_ids for g in other] != [g.completion_ids for g in together]
    torch.manual_seed(5)
    fresh = generate_groups(model, tok, prompts, generations=4, max_new_tokens=16, temperature=1.0)
    drawn = [key for g in fresh for key in g.keys]
    assert len(set(drawn)) == 12 and all(len(key) == 32 for key in drawn)
    torch.manual_seed(5)  # a seeded run (a node's --seed) draws the same keys and completions again
    again = generate_groups(model, tok, prompts, generations=4, max_new_tokens=16, temperature=1.0)
    assert [g.keys for g in again] == [g.keys for g in fresh]
    assert [g.completion_ids for g in again] == [g.completion_ids for g in fresh]
    with pytest.raises(ValueError):
        generate_groups(model, tok, prompts, generations=4, max_new_tokens=4, temperature=1.0, keys=keys[:2])


def _rows(groups):
    return (
        [ids for g in groups for ids in g.completion_ids],
        [t for g in groups for t in g.truncated],
        np.concatenate([lp for g in groups for lp in g.logprobs]),
    )


def _same(a, b):
    """The same tokens and stops, and log-probabilities equal up to float32 rounding."""
    return a[:2] == b[:2] and np.allclose(a[2], b[2], atol=1e-4)


def test_the_static_path_draws_the_same_tokens_as_the_dropping_loop_greedy_and_sampled(tiny_policy):
    # The GPU's path (fixed shapes, stopped rows masked, one sync a round) run on the CPU, uncompiled.
    model, tok = tiny_policy
    stream = TaskStream(CATALOGUES["easy"], seed=7)
    prompts = [format_prompt(tok, q.question) for q in sample_questions(stream, 3)]
    for temperature in (0.0, 0.8):
        results = []
        for static in (False, True):
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
                        keys=_keys(prompts, 4),
                    )
                )
            )
        assert _same(results[0], results[1])
        ids, truncated, _ = results[1]
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
        results.append(
            _rows(
                generate_groups(
                    model,
                    tok,
                    PROMPTS,
                    generations=4,
                    max_new_tokens=6,
                    temperature=1.0,
                    static=True,
                    compile=compile,
                    keys=_keys(PROMPTS, 4),
                )
            )
        )
    assert _same(results[0], results[1]) and _same(results[1], results[2])
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
    for i, temperature in enumerate((1.0, 2.0, 2.0, 2.0)):
        keys = _keys(prompts, 8, str(i).encode())
        groups = generate_groups(
            model, tok, prompts, generations=8, max_new_tokens=48, temperature=temperature, keys=keys
        )
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
    assert (sample_tokens(logits, None, 0.0, refused)[0] != nul[0]).all()
    u = torch.linspace(0, 1 - 2**-53, 2048, dtype=torch.float64)
    assert (sample_tokens(logits[:1].expand(2048, -1), u, 1.0, refused)[0] != nul[0]).all()


def test_printable_refuses_what_moderation_counts_as_non_printable_and_unstorable_text():
    assert printable("Answer:\t<answer>3 × 4 = 12 — é</answer>\r\n")
    for c in ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\u200b", "\u202e", "\ufeff", "\ud800", "\udfff", "\ufffd"]:
        assert not printable(f"ok{c}ok"), repr(c)
