"""The GRPO maths, against hand-computed tensors, and one real update on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from node_toys import collate, make_policy

from sapo_node.generate import encode_prompt
from sapo_node.groups import TrainGroup
from sapo_node.grpo import (
    ADVANTAGE_EPS,
    clipped_loss,
    collate_groups,
    completion_logprobs,
    group_advantages,
    grpo_update,
    plain_lm_head,
    token_logprobs,
)


def test_advantages_are_normalised_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    std0 = math.sqrt(1 / 3)  # unbiased: sum of squares 4 * 0.25 over 3
    std1 = math.sqrt((0.75**2 + 3 * 0.25**2) / 3)
    expected = torch.tensor(
        [
            [
                0.5 / (std0 + ADVANTAGE_EPS),
                -0.5 / (std0 + ADVANTAGE_EPS),
                -0.5 / (std0 + ADVANTAGE_EPS),
                0.5 / (std0 + ADVANTAGE_EPS),
            ],
            [
                0.75 / (std1 + ADVANTAGE_EPS),
                -0.25 / (std1 + ADVANTAGE_EPS),
                -0.25 / (std1 + ADVANTAGE_EPS),
                -0.25 / (std1 + ADVANTAGE_EPS),
            ],
        ]
    )
    torch.testing.assert_close(group_advantages(rewards), expected)


def test_a_group_whose_rewards_agree_has_zero_advantages():
    assert torch.equal(group_advantages(torch.tensor([1.0, 1.0, 1.0, 1.0])), torch.zeros(4))
    assert torch.equal(group_advantages(torch.tensor([[0.0, 0.0], [0.5, 0.5]])), torch.zeros(2, 2))


def _loss_case():
    # Row 0 has advantage +1 and ratios 1, 1.5, 0.5; row 1 has advantage -1 and ratios 1, 0.5, 2 (last token is padding).
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5], [1.0, 0.5, 2.0]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp, old, adv, mask


def test_clipped_loss_by_hand():
    logp, old, adv, mask = _loss_case()
    loss, stats = clipped_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # per token: row 0: -1, -min(1.5, 1.28) = -1.28, -min(0.5, 0.8) = -0.5
    #            row 1: -min(-1, -1) = 1, -min(-0.5, -0.8) = 0.8, (masked)
    torch.testing.assert_close(loss, torch.tensor((-1 - 1.28 - 0.5 + 1 + 0.8) / 5))
    # clipped: row 0 token 1 (ratio above 1 + eps_high, A > 0) and row 1 token 1 (below 1 - eps_low, A < 0)
    torch.testing.assert_close(stats["clip_fraction"], torch.tensor(2 / 5))
    loss.backward()
    # d/dlogp of -A * ratio / 5 where not clipped, 0 where clipped or masked
    expected = torch.tensor([[-1.0 / 5, 0.0, -0.5 / 5], [1.0 / 5, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def test_clipped_loss_ignores_padding_and_takes_a_global_token_count():
    logp, old, adv, mask = _loss_case()
    loss, _ = clipped_loss(logp, old, adv, mask)
    changed = logp.detach().clone()
    changed[1, 2] = 5.0  # a padded position: any value
    loss2, _ = clipped_loss(changed, old, adv, mask)
    torch.testing.assert_close(loss, loss2)
    loss10, stats10 = clipped_loss(logp, old, adv, mask, num_tokens=10)
    torch.testing.assert_close(loss10, loss * 5 / 10)
    torch.testing.assert_close(stats10["clip_fraction"], torch.tensor(2 / 10))


def test_ratio_one_is_never_clipped_and_kl_uses_k3():
    logp = torch.zeros(1, 2)
    ref = torch.log(torch.tensor([[2.0, 1.0]]))
    loss, stats = clipped_loss(logp, logp, torch.tensor([0.0]), torch.ones(1, 2), ref_logp=ref, kl_coef=0.1)
    k3 = 2.0 - math.log(2.0) - 1.0  # e^d - d - 1 with d = log 2; 0 for the second token
    torch.testing.assert_close(stats["kl"], torch.tensor(k3 / 2))
    torch.testing.assert_close(loss, torch.tensor(0.1 * k3 / 2))
    assert stats["clip_fraction"].item() == 0.0


def test_token_logprobs_match_a_plain_forward_pass_despite_padding():
    model, tok = make_policy("a")
    rows = [([5, 6, 7], [8, 9], 0.0), ([5], [8, 9, 10, 11], 0.0)]
    batch = collate(rows, tok.pad_token_id, "cpu")
    logp = token_logprobs(model, batch.input_ids, batch.attention_mask, batch.completion_mask.shape[1])
    for i, (prompt, completion, _) in enumerate(rows):
        ids = torch.tensor([prompt + completion])
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        alone = logits.gather(1, torch.tensor(completion)[:, None]).squeeze(1)
        torch.testing.assert_close(logp[i, : len(completion)], alone, atol=1e-5, rtol=1e-4)


def _sequence_logprob(model, prompt_ids, completion_ids):
    with torch.no_grad():
        batch = collate([(prompt_ids, completion_ids, 0.0)], 0, "cpu")
        return token_logprobs(model, batch.input_ids, batch.attention_mask, len(completion_ids)).sum().item()


@pytest.mark.parametrize("epochs", [1, 3])
def test_one_update_raises_the_rewarded_completion(epochs):
    model, tok = make_policy("a", seed=1)
    prompt = encode_prompt(tok, "Question: What is 2 + 3?\nAnswer:")
    good = tok(" <answer>5</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    bad = tok(" <answer>7</answer>", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    group = TrainGroup("g", "local", prompt, [good, bad, good, bad], [1.0, 0.0, 1.0, 0.0])
    before = [p.detach().clone() for p in model.parameters()]
    good_before, bad_before = _sequence_logprob(model, prompt, good), _sequence_logprob(model, prompt, bad)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = grpo_update(model, optimizer, [group], pad_id=tok.pad_token_id, epochs=epochs, micro_batch=3)

    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    good_after, bad_after = _sequence_logprob(model, prompt, good), _sequence_logprob(model, prompt, bad)
    assert good_after > good_before
    assert good_after - bad_after > good_before - bad_before  # the rewarded answer gains on the other
    assert stats.steps == epochs and stats.sequences == 4 and stats.tokens == 2 * len(good) + 2 * len(bad)
    if epochs == 1:
        assert stats.clip_fraction == 0.0  # the first step's ratio is exactly 1


def test_no_groups_no_step():
    model, tok = make_policy("a")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    stats = grpo_update(model, optimizer, [], pad_id=tok.pad_token_id)
    assert stats.steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_the_kl_penalty_starts_at_zero_and_grows_as_the_policy_moves():
    import copy

    model, tok = make_policy("a", seed=2)
    reference = copy.deepcopy(model).requires_grad_(False)
    prompt = encode_prompt(tok, "Question: What is 2 + 3?\nAnswer:")
    group = TrainGroup("g", "local", prompt, [[10, 11, tok.eos_token_id], [12, tok.eos_token_id]], [1.0, 0.0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    kwargs = dict(pad_id=tok.pad_token_id, kl_coef=0.5, reference=reference)
    assert grpo_update(model, optimizer, [group], **kwargs).kl == 0.0  # policy == reference before the first step
    assert grpo_update(model, optimizer, [group], **kwargs).kl > 0.0


# --- the fast path (completion_logprobs) against the reference (token_logprobs) ---------------------


def _mixed_groups(tok):
    """Three groups: prompts of different lengths, completions of 1 to 6 tokens (one group's twice)."""
    eos = tok.eos_token_id
    p1 = encode_prompt(tok, "Question: What is 2 + 3?\nAnswer:")
    p2 = encode_prompt(tok, "Question: Is 2024 a leap year? Answer with Yes or No.\nAnswer:")
    p3 = encode_prompt(tok, "Q:")
    return [
        TrainGroup(
            "a", "local", p1, [[10, 11, 12, eos], [13, eos], [14, 15, 16, 17, 18, 19], [eos]], [1.0, 0.0, 0.5, 0.0]
        ),
        TrainGroup("b", "local", p2, [[20, 21, eos], [22, 23, 24, 25, eos]], [0.0, 1.0]),
        TrainGroup("c", "local", p3, [[30, 31], [30, 31], [32, eos]], [1.0, 1.0, 0.0]),
    ]


def _rows(groups):
    rows = []
    for g in groups:
        adv = group_advantages(torch.tensor(g.rewards)).tolist()
        rows += [(g.prompt_ids, c, a) for c, a in zip(g.completion_ids, adv, strict=True)]
    return rows


def _shared_prefix_groups(tok):
    """Three groups whose prompts begin with the same 20 tokens (as a chat model's system message and
    worked turns do), then 1 to 5 tokens of their own."""
    eos, head = tok.eos_token_id, list(range(5, 25))
    return [
        TrainGroup("a", "local", [*head, 40, 41, 42], [[10, 11, eos], [12, eos], [13, 14, 15, 16]], [1.0, 0.0, 0.5]),
        TrainGroup("b", "local", [*head, 43], [[20, eos], [21, 22, 23, eos]], [0.0, 1.0]),
        TrainGroup("c", "local", [*head, 44, 45, 46, 47, 48], [[30, 31], [32, eos]], [1.0, 0.0]),
    ]


def _assert_fast_path_equals_full_forward(model, rows, pad, dtype, tol):
    grouped = collate_groups(rows, pad, "cpu")
    flat = collate(rows, pad, "cpu")
    weights = torch.randn(grouped.completion_mask.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)

    def logps_and_grads(fn):
        model.zero_grad(set_to_none=True)
        logp = fn() * grouped.completion_mask
        (logp * weights).sum().backward()  # any linear functional of the log-probs exercises the whole backward pass
        return logp.detach(), [p.grad.clone() for p in model.parameters()]

    fast, fast_grads = logps_and_grads(lambda: completion_logprobs(model, grouped, temperature=0.7))
    ref, ref_grads = logps_and_grads(
        lambda: token_logprobs(model, flat.input_ids, flat.attention_mask, flat.completion_mask.shape[1], 0.7)
    )
    assert plain_lm_head(model) is model.lm_head  # the fast path ran
    torch.testing.assert_close(fast, ref, atol=tol, rtol=0)
    # Gradients agree to 1e-5 of their largest entry in both dtypes (some 80 float32 steps), not to
    # float64 precision: the model's RMSNorm computes in float32 whatever the dtype, and the fast path
    # sums a shared prompt's gradient over its rows before that rounding, the reference after. How the
    # roundings fall depends on the CPU's kernels: 1.1e-6 of the largest entry was seen on one machine.
    for a, b in zip(fast_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5 * b.abs().max().item(), rtol=0)
    return grouped


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_completion_logprobs_and_their_gradient_equal_a_full_forward_per_sequence(dtype, tol):
    model, tok = make_policy("a", seed=3)
    model = model.to(dtype)
    grouped = _assert_fast_path_equals_full_forward(model, _rows(_mixed_groups(tok)), tok.pad_token_id, dtype, tol)
    assert grouped.prompt_ids.shape[0] == 3 and grouped.completion_ids.shape == (9, 6)  # each prompt once
    assert grouped.shared == 0  # these prompts share 2 tokens: plain left padding


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_prompts_that_begin_alike_share_one_pass_and_the_log_probs_and_gradient_are_unchanged(dtype, tol):
    model, tok = make_policy("a", seed=8)
    model = model.to(dtype)
    rows = _rows(_shared_prefix_groups(tok))
    grouped = _assert_fast_path_equals_full_forward(model, rows, tok.pad_token_id, dtype, tol)
    assert grouped.shared == 20 and grouped.prompt_ids.shape == (3, 25)  # 20 shared, then up to 5 of their own
    assert grouped.prompt_mask[1].tolist() == [1] * 20 + [0] * 4 + [1]  # the padding sits after the prefix


def test_target_logprobs_gradient_in_chunks_matches_finite_differences():
    from sapo_node.grpo import _TargetLogprobs

    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(7, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(7, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3, 1])
    fn = lambda h, w, b: _TargetLogprobs.apply(h, w, b, targets, 0.7, 2)  # noqa: E731  chunks of 2, 2 and 1 positions
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))
    by_hand = (torch.nn.functional.linear(hidden, weight, bias) / 0.7).log_softmax(-1)[torch.arange(5), targets]
    torch.testing.assert_close(fn(hidden, weight, bias), by_hand)


def test_a_model_with_soft_capped_logits_falls_back_to_the_full_forward():
    model, tok = make_policy("a", seed=4)
    model.config.final_logit_softcapping = 30.0  # as Gemma 2 has: lm_head(hidden) is not its logits
    rows = _rows(_mixed_groups(tok))
    grouped = collate_groups(rows, tok.pad_token_id, "cpu")
    flat = collate(rows, tok.pad_token_id, "cpu")
    assert plain_lm_head(model) is None
    with torch.no_grad():
        fast = completion_logprobs(model, grouped)
        ref = token_logprobs(model, flat.input_ids, flat.attention_mask, flat.completion_mask.shape[1])
    torch.testing.assert_close(fast, ref * flat.completion_mask, atol=1e-6, rtol=0)


def _per_row_grpo_update(model, optimizer, groups, *, pad_id, epochs, micro_batch, kl_coef=0.0, reference=None):
    """The update by its definition, without the fast path: token_logprobs on prompt + completion per
    row, in the groups' order, a separate stored copy of the first epoch's log-probs as the old ones."""
    rows = _rows(groups)
    tokens = sum(len(c) for _, c, _ in rows)
    batches = [collate(rows[i : i + micro_batch], pad_id, "cpu") for i in range(0, len(rows), micro_batch)]
    old, ref, losses = [], [], []
    for epoch in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, b in enumerate(batches):
            t_len = b.completion_mask.shape[1]
            logp = token_logprobs(model, b.input_ids, b.attention_mask, t_len)
            if epoch == 0:
                old.append(logp.detach())
                with torch.no_grad():
                    ref.append(token_logprobs(reference, b.input_ids, b.attention_mask, t_len) if kl_coef else None)
            loss, _ = clipped_loss(
                logp, old[i], b.advantages, b.completion_mask, ref_logp=ref[i], kl_coef=kl_coef, num_tokens=tokens
            )
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return losses[-1]


@pytest.mark.parametrize(("epochs", "kl_coef", "micro_batch"), [(1, 0.0, 4), (1, 0.0, 16), (3, 0.1, 5)])
def test_the_update_equals_the_per_row_reference(epochs, kl_coef, micro_batch):
    import copy

    model, tok = make_policy("a", seed=5)
    reference = copy.deepcopy(model).requires_grad_(False)
    groups = _mixed_groups(tok)
    before = copy.deepcopy(model)
    # SGD with lr 1 and no clipping: each step moves the parameters by exactly minus the gradient.
    stats = grpo_update(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        groups,
        pad_id=tok.pad_token_id,
        epochs=epochs,
        micro_batch=micro_batch,
        kl_coef=kl_coef,
        reference=reference,
        max_grad_norm=float("inf"),
    )
    loss = _per_row_grpo_update(
        before,
        torch.optim.SGD(before.parameters(), lr=1.0),
        groups,
        pad_id=tok.pad_token_id,
        epochs=epochs,
        micro_batch=micro_batch,
        kl_coef=kl_coef,
        reference=reference,
    )
    assert stats.loss == pytest.approx(loss, abs=1e-6)
    for a, b in zip(model.parameters(), before.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    moved = max((a - b).abs().max().item() for a, b in zip(model.parameters(), reference.parameters(), strict=True))
    assert moved > 1e-4  # the update did move the policy, so the comparison means something


def test_the_fused_optimizer_takes_the_same_steps_as_plain_adamw():
    import copy

    from sapo_node.grpo import make_optimizer

    model, _ = make_policy("a", seed=6)
    twin = copy.deepcopy(model)
    fused = make_optimizer(model, lr=1e-2, weight_decay=0.01)
    plain = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01)
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p, q in zip(model.parameters(), twin.parameters(), strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        fused.step()
        plain.step()
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0)


def test_completion_logprobs_of_one_token_completions_come_from_the_prompt_alone():
    model, tok = make_policy("a", seed=7)
    rows = [([5, 6, 7], [tok.eos_token_id], 1.0), ([5, 6, 7], [9], -1.0), ([8], [10], 0.0)]
    grouped, flat = collate_groups(rows, tok.pad_token_id, "cpu"), collate(rows, tok.pad_token_id, "cpu")
    assert grouped.completion_ids.shape == (3, 1)
    with torch.no_grad():
        fast = completion_logprobs(model, grouped)
        ref = token_logprobs(model, flat.input_ids, flat.attention_mask, 1)
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=0)
