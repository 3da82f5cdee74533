"""Replaying a completion under the weights, prompt and key that generated it (sapo_node.audit): honest
completions pass, at the sampling temperature and greedy, generated in float32 or bfloat16 and
audited in float32; one altered token, other weights, another key or a forged log-probability fail."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from node_toys import make_policy
from transformers import AutoModelForCausalLM

from sapo_node import proof
from sapo_node.audit import (
    EPS,
    LOGPROB_TOL,
    GroupInput,
    ReplayInputError,
    model_digest,
    replay,
    replay_batch,
    replay_groups,
    tolerances,
)
from sapo_node.generate import generate_groups, refused_tokens, stop_ids
from sapo_node.prompts import format_prompt
from sapo_node.sample import sample_questions
from sapo_node.shared_prefix import MIN_SHARED_PREFIX, shared_prefix
from sapo_node.tasks import CATALOGUES, TaskStream


def _generate(model, tok, prompts, temperature, *, generations=8, max_new_tokens=24, tag="c"):
    keys = [[proof.completion_key(tag, "easy", 7, b, k) for k in range(generations)] for b in range(len(prompts))]
    return generate_groups(
        model, tok, prompts, generations=generations, max_new_tokens=max_new_tokens, temperature=temperature, keys=keys
    )


def _replay_all(model, tok, groups, temperature, **kwargs):
    return [
        r
        for g in groups
        for r in replay_groups(
            model, tok, g.prompt_ids, g.completion_ids, g.keys, temperature, logprobs=g.logprobs, **kwargs
        )
    ]


def _prompts(tok, n=3, seed=7):
    return [format_prompt(tok, q.question) for q in sample_questions(TaskStream(CATALOGUES["easy"], seed=seed), n)]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_honest_completions_replay_as_passing(tiny_mini_policy, temperature):
    model, tok = tiny_mini_policy
    groups = _generate(model, tok, _prompts(tok), temperature)
    results = _replay_all(model, tok, groups, temperature)
    assert len(results) == 24 and all(r.passed for r in results), [r for r in results if not r.passed]
    assert sum(r.tokens for r in results) == sum(len(c) for g in groups for c in g.completion_ids)
    assert min(r.margin for r in results) >= 0  # same machine, same dtype: inside the interval itself
    assert max(r.logprob_error for r in results) < 1e-4
    # One completion alone gives the batch's verdict.
    g = groups[1]
    alone = replay(model, tok, g.prompt_ids, g.completion_ids[3], g.keys[3], temperature, logprobs=g.logprobs[3])
    assert alone.passed and alone.tokens == len(g.completion_ids[3])


def _far_token(model, tok, g, k, t, temperature):
    """A token for position t of completion k whose cdf interval lies far from the draw's target."""
    stops = stop_ids(model, tok)
    refused = refused_tokens(tok, model.config.vocab_size, "cpu", stops)
    ids = torch.tensor([g.prompt_ids + g.completion_ids[k][:t]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1].float().masked_fill(refused, -torch.inf)
    if temperature == 0:
        allowed = logits.masked_fill(torch.isin(torch.arange(len(logits)), torch.tensor(sorted(stops))), torch.inf)
        return int(torch.argmin(allowed))  # the least likely token: far below the argmax
    cdf = torch.cumsum(torch.softmax(logits / temperature, -1), -1, dtype=torch.float64)
    target = proof.uniforms(g.keys[k], t + 1)[t] * float(cdf[-1])
    lo = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[:-1]])
    distance = torch.maximum(lo - target, target - cdf).clamp(min=0)
    distance[refused] = -1
    distance[sorted(stops)] = -1
    return int(torch.argmax(distance))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_one_altered_token_fails_at_its_position(tiny_mini_policy, temperature):
    model, tok = tiny_mini_policy
    groups = _generate(model, tok, _prompts(tok, 1), temperature, generations=4)
    g = groups[0]
    k = max(range(4), key=lambda i: len(g.completion_ids[i]))
    t = len(g.completion_ids[k]) // 2
    forged = list(g.completion_ids[k])
    forged[t] = _far_token(model, tok, g, k, t, temperature)
    assert forged[t] != g.completion_ids[k][t]
    # With the honest log-probabilities, and with no claim at all: the token itself fails.
    for logprobs in (g.logprobs[k], None):
        r = replay(model, tok, g.prompt_ids, forged, g.keys[k], temperature, logprobs=logprobs)
        assert not r.passed and r.failed_at == t and r.reason == "token" and r.margin < -EPS


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_cached_replay_equals_each_sequence_run_whole(tiny_mini_policy, temperature):
    # The prompt once and its cache copied to the rows gives, per token, what one pass over prompt +
    # completion gives: a row's log-probabilities to 1e-4, and a forged token fails at its position.
    model, tok = tiny_mini_policy
    g = _generate(model, tok, _prompts(tok, 1), temperature)[0]
    # Unequal lengths (an honest completion's beginning is one too), one of a single token.
    rows = [c[: max(1, len(c) - i)] for i, c in enumerate(g.completion_ids)] + [g.completion_ids[0][:1]]
    keys = [*g.keys, g.keys[0]]
    assert len({len(r) for r in rows}) > 2
    refused = refused_tokens(tok, model.config.vocab_size, "cpu", stop_ids(model, tok))
    p = len(g.prompt_ids)
    whole = []
    with torch.no_grad():
        for row in rows:
            logits = model(input_ids=torch.tensor([g.prompt_ids + row])).logits[0, p - 1 : -1]  # (T, V)
            logp = torch.log_softmax(logits.float().masked_fill(refused, -torch.inf) / (temperature or 1.0), -1)
            whole.append(logp.gather(-1, torch.tensor(row)[:, None]).squeeze(1).tolist())
    replays = {
        cached: replay_groups(model, tok, g.prompt_ids, rows, keys, temperature, logprobs=whole, cached=cached)
        for cached in (True, False)
    }
    for cached, results in replays.items():
        assert all(r.passed for r in results), (cached, results)
        assert max(r.logprob_error for r in results) < 1e-4
    assert max(abs(a.margin - b.margin) for a, b in zip(replays[True], replays[False], strict=True)) < 1e-4

    k = max(range(len(rows)), key=lambda i: len(rows[i]))
    t = len(rows[k]) // 2
    forged = list(rows[k])
    forged[t] = _far_token(model, tok, g, k, t, temperature)
    for cached in (True, False):
        r = replay_groups(model, tok, g.prompt_ids, [forged, rows[-1]], [keys[k], keys[-1]], temperature, cached=cached)
        assert (r[0].failed_at, r[0].reason) == (t, "token") and r[0].margin < -EPS and r[1].passed


@pytest.mark.parametrize("preamble", [False, True])
def test_groups_replayed_in_one_pass_give_each_groups_own_verdicts(tiny_mini_policy, preamble):
    """replay_batch (the audit worker's pass over a job's groups) gives, per completion, what replaying
    each group alone gives, with prompts of different lengths left-padded and, behind a long common
    preamble (a chat model's system message), that prefix run once; a forged token fails its own
    group's completion only, and a malformed group is named by its place."""
    model, tok = tiny_mini_policy
    prompts = _prompts(tok, 4, seed=11)
    if preamble:
        prompts = ["You are a careful assistant. Think step by step, then answer in tags. " * 2 + p for p in prompts]
    groups = _generate(model, tok, prompts, 1.0, generations=3, max_new_tokens=16)
    lengths = {len(g.prompt_ids) for g in groups}
    shared = shared_prefix([g.prompt_ids for g in groups])
    assert len(lengths) > 1 and (shared >= MIN_SHARED_PREFIX) == preamble
    inputs = [GroupInput(g.prompt_ids, g.completion_ids, g.keys, 1.0, g.logprobs) for g in groups]
    together = replay_batch(model, tok, inputs)
    alone = [
        replay_groups(model, tok, g.prompt_ids, g.completion_ids, g.keys, 1.0, logprobs=g.logprobs) for g in groups
    ]
    assert [len(r) for r in together] == [3] * 4
    for batch_results, own in zip(together, alone, strict=True):
        assert all(r.passed for r in batch_results)
        for a, b in zip(batch_results, own, strict=True):
            assert a.tokens == b.tokens and abs(a.margin - b.margin) < 1e-4 and a.logprob_error < 1e-4

    g, k = groups[2], 1
    t = len(g.completion_ids[k]) // 2
    forged = [list(c) for c in g.completion_ids]
    forged[k][t] = _far_token(model, tok, g, k, t, 1.0)
    inputs[2] = GroupInput(g.prompt_ids, forged, g.keys, 1.0)
    verdicts = replay_batch(model, tok, inputs)
    assert [[r.passed for r in v] for v in verdicts] == [[True] * 3, [True] * 3, [True, False, True], [True] * 3]
    assert (verdicts[2][k].failed_at, verdicts[2][k].reason) == (t, "token")

    inputs[3] = GroupInput(g.prompt_ids, [[model.config.vocab_size]], [g.keys[0]], 1.0)
    with pytest.raises(ReplayInputError, match="outside the model's vocabulary") as raised:
        replay_batch(model, tok, inputs)
    assert raised.value.index == 3


def test_a_forged_log_probability_or_an_early_stop_fails(tiny_mini_policy):
    model, tok = tiny_mini_policy
    g = _generate(model, tok, _prompts(tok, 1), 1.0, generations=2)[0]
    claimed = list(g.logprobs[0])
    claimed[2] -= 1.0
    r = replay(model, tok, g.prompt_ids, g.completion_ids[0], g.keys[0], 1.0, logprobs=claimed)
    assert not r.passed and (r.failed_at, r.reason) == (2, "logprob") and r.logprob_error > 0.9
    # Tokens after a stop token were never generated.
    longer = [*g.completion_ids[0][:2], tok.eos_token_id, *g.completion_ids[0][2:]]
    r = replay(model, tok, g.prompt_ids, longer, g.keys[0], 1.0)
    assert not r.passed and r.failed_at <= 2


def test_completions_of_other_weights_fail(tiny_mini_policy):
    # The same architecture and tokenizer at another seed, untrained: a node that claims the trained
    # weights but generated with cheaper ones, and one that claims weights it did not generate with.
    model, tok = tiny_mini_policy
    torch.manual_seed(1)
    other = AutoModelForCausalLM.from_config(model.config).eval()
    assert model_digest(other) != model_digest(model)
    for generator, auditor in ((other, model), (model, other)):
        groups = _generate(generator, tok, _prompts(tok), 1.0)
        results = _replay_all(auditor, tok, groups, 1.0)
        assert not any(r.passed for r in results)
        assert max(r.margin for r in results) < -10 * EPS
        assert all(r.passed for r in _replay_all(generator, tok, groups, 1.0))


def test_completions_replayed_with_another_key_fail(tiny_mini_policy):
    model, tok = tiny_mini_policy
    groups = _generate(model, tok, _prompts(tok), 1.0)
    shifted = [dataclasses.replace(g, keys=g.keys[1:] + g.keys[:1]) for g in groups]  # each completion, a sibling's key
    results = _replay_all(model, tok, shifted, 1.0)
    # A completion fails unless its sibling's stream draws the same tokens (short, near-certain answers).
    failed = [r for r in results if not r.passed]
    assert len(failed) >= len(results) // 2
    regenerated = _generate(model, tok, _prompts(tok), 1.0, tag="another challenge")
    results = [
        r
        for g, h in zip(groups, regenerated, strict=True)
        for r in replay_groups(model, tok, g.prompt_ids, g.completion_ids, h.keys, 1.0, logprobs=g.logprobs)
    ]
    assert sum(not r.passed for r in results) >= len(results) // 2


def test_bfloat16_generation_audited_in_float32_passes(tiny_mini_policy):
    model, tok = tiny_mini_policy
    generator = copy.deepcopy(model).to(torch.bfloat16)
    auditor = copy.deepcopy(generator).float()  # the uploaded bfloat16 weights, run in float32
    eps, logprob_tol = tolerances(torch.bfloat16)
    assert tolerances(torch.float32) == (EPS, LOGPROB_TOL) and eps >= EPS and logprob_tol >= LOGPROB_TOL
    for temperature in (1.0, 0.0):
        groups = _generate(generator, tok, _prompts(tok, 4, seed=11), temperature)
        results = _replay_all(auditor, tok, groups, temperature, eps=eps, logprob_tol=logprob_tol)
        assert all(r.passed for r in results), [r for r in results if not r.passed]
        assert max(r.logprob_error for r in results) > 0  # the dtypes did differ


def test_model_digest_commits_to_every_weight_and_its_dtype():
    model, _ = make_policy("a")
    digest = model_digest(model)
    assert len(digest) == 64 and digest == model_digest(copy.deepcopy(model))
    state = model.state_dict()
    expected = proof.weights_digest(
        (name, "float32", tuple(t.shape), t.numpy().astype("<f4").tobytes()) for name, t in state.items()
    )
    assert digest == expected
    changed = copy.deepcopy(model)
    with torch.no_grad():
        next(changed.parameters()).view(-1)[5] += 1e-6
    assert model_digest(changed) != digest
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert model_digest(half) not in (digest, model_digest(half.float()))
    assert model_digest(half) == model_digest(copy.deepcopy(half))


def test_input_that_cannot_be_a_completion_is_refused():
    model, tok = make_policy("a")
    key = proof.completion_key("c", "d", 0, 0, 0)
    with pytest.raises(ValueError):
        replay(model, tok, [1, 2], [model.config.vocab_size], key, 1.0)
    with pytest.raises(ValueError):
        replay(model, tok, [1, 2], [], key, 1.0)
    with pytest.raises(ValueError):
        replay(model, tok, [1, 2], [3, 4], key, 1.0, logprobs=[-1.0])
    with pytest.raises(ValueError):
        limit = model.config.max_position_embeddings
        replay(model, tok, [1] * (limit - 10), [3] * 20, key, 1.0)  # past its positions
    with pytest.raises(ValueError):
        replay(model, tok, [1, 2], [3], key, -1.0)
