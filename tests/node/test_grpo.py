"""The GRPO maths, against hand-computed tensors, and one real update on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from node_toys import make_policy

from sapo_node.generate import encode_prompt
from sapo_node.groups import TrainGroup
from sapo_node.grpo import ADVANTAGE_EPS, clipped_loss, collate, group_advantages, grpo_update, token_logprobs


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
