"""Step 6 of a round: the GRPO update.

The maths is in three pure functions tested with hand-computed tensors:
  group_advantages  (r - mean) / (std + eps) within a group
  clipped_loss      token-level clipped-ratio loss (DAPO's token mean, clip-higher), optional k3 KL
  token_logprobs    log-probs of the completion tokens under a model
`grpo_update` strings them together: one optimizer step per epoch over the whole training set,
gradients accumulated over micro-batches. The "old" log-probs are those of the policy before the
update: the first epoch's forward pass computes them (so its ratio is exactly 1) and later epochs
reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from sapo_node.groups import TrainGroup

ADVANTAGE_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """(..., G) -> (..., G): rewards normalised within each group by its mean and sample std.

    A group whose rewards all agree gets zero advantages (it carries no signal).
    """
    mean = rewards.mean(dim=-1, keepdim=True)  # (..., 1)
    std = rewards.std(dim=-1, keepdim=True)  # (..., 1), unbiased like TRL and verl
    return (rewards - mean) / (std + eps)


def clipped_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective to minimise, averaged over completion tokens (DAPO's token-level mean).

    logp, old_logp, ref_logp, mask: (N, T); advantages: (N,). `num_tokens` is the denominator
    (default: mask.sum()); give the whole training set's token count when accumulating micro-batches.
    Returns (loss, stats) with stats' clip_fraction (share of tokens whose gradient the clip cut off)
    and kl (token mean of k3), both as sums over this batch divided by the same denominator.
    """
    mask = mask.to(logp.dtype)
    denom = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens, dtype=logp.dtype)
    denom = denom.clamp(min=1.0)
    adv = advantages[:, None]  # (N, 1)
    ratio = torch.exp(logp - old_logp)  # (N, T)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)  # (N, T)

    kl = torch.zeros_like(per_token)
    if ref_logp is not None and kl_coef != 0.0:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0  # k3 estimator of KL(policy || reference), >= 0
        per_token = per_token + kl_coef * kl

    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    loss = (per_token * mask).sum() / denom
    stats = {
        "clip_fraction": ((low | high).to(mask.dtype) * mask).sum().detach() / denom,
        "kl": (kl * mask).sum().detach() / denom,
    }
    return loss, stats


def token_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_len: int, temperature: float = 1.0
) -> torch.Tensor:
    """(N, P + T) ids, prompt left padded and completion right padded -> (N, T) log-probs of the
    completion tokens. Only the last T+1 positions' logits are materialised (vocabularies are large)."""
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # left padding: positions start at 0
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=completion_len + 1,
    ).logits  # (N, T + 1, V)
    logits = logits[:, :-1, :].float() / temperature  # position t predicts token t + 1
    targets = input_ids[:, -completion_len:]  # (N, T)
    return torch.gather(logits.log_softmax(dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)  # (N, T)


@dataclass
class Sequences:
    """A micro-batch laid out for `token_logprobs`, with each sequence's advantage."""

    input_ids: torch.Tensor  # (N, P + T)
    attention_mask: torch.Tensor  # (N, P + T)
    completion_mask: torch.Tensor  # (N, T)
    advantages: torch.Tensor  # (N,)


def collate(rows: list[tuple[list[int], list[int], float]], pad: int, device: Any) -> Sequences:
    """(prompt ids, completion ids, advantage) rows -> left-padded prompts, right-padded completions."""
    p_len = max(len(p) for p, _, _ in rows)
    t_len = max(max(len(c) for _, c, _ in rows), 1)
    ids, attn, cmask = [], [], []
    for prompt, completion, _ in rows:
        left, right = p_len - len(prompt), t_len - len(completion)
        ids.append([pad] * left + prompt + completion + [pad] * right)
        attn.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
        cmask.append([1] * len(completion) + [0] * right)
    return Sequences(
        input_ids=torch.tensor(ids, device=device),
        attention_mask=torch.tensor(attn, device=device),
        completion_mask=torch.tensor(cmask, device=device),
        advantages=torch.tensor([a for _, _, a in rows], dtype=torch.float32, device=device),
    )


@dataclass
class UpdateStats:
    loss: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    tokens: int = 0
    sequences: int = 0
    steps: int = 0


def grpo_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    groups: list[TrainGroup],
    *,
    pad_id: int,
    epochs: int = 1,
    micro_batch: int = 16,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    kl_coef: float = 0.0,
    reference: Any = None,
    max_grad_norm: float = 1.0,
    temperature: float = 1.0,
) -> UpdateStats:
    """Train `model` on `groups` (each must have at least two completions). Returns the last epoch's
    loss and clip fraction; no step is taken when `groups` is empty."""
    rows = []
    for group in groups:
        adv = group_advantages(torch.tensor(group.rewards, dtype=torch.float32)).tolist()
        rows += [(group.prompt_ids, ids, a) for ids, a in zip(group.completion_ids, adv, strict=True)]
    stats = UpdateStats(sequences=len(rows), tokens=sum(len(c) for _, c, _ in rows))
    if not rows or stats.tokens == 0:
        return stats

    device = next(model.parameters()).device
    batches = [collate(rows[i : i + micro_batch], pad_id, device) for i in range(0, len(rows), micro_batch)]
    old: list[torch.Tensor] = []
    ref: list[torch.Tensor | None] = []
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()  # no dropout: the ratio must compare the same function
    for epoch in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        loss_sum = clip_sum = kl_sum = 0.0
        for i, batch in enumerate(batches):
            t_len = batch.completion_mask.shape[1]
            logp = token_logprobs(model, batch.input_ids, batch.attention_mask, t_len, temperature)  # (N, T)
            if epoch == 0:
                old.append(logp.detach())
                ref.append(_reference_logprobs(reference, batch, t_len, temperature) if kl_coef else None)
            loss, s = clipped_loss(
                logp, old[i], batch.advantages, batch.completion_mask,
                eps_low=eps_low, eps_high=eps_high, ref_logp=ref[i], kl_coef=kl_coef, num_tokens=stats.tokens,
            )  # fmt: skip
            loss.backward()
            loss_sum += loss.item()
            clip_sum += s["clip_fraction"].item()
            kl_sum += s["kl"].item()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        stats.loss, stats.clip_fraction, stats.kl = loss_sum, clip_sum, kl_sum
        stats.grad_norm, stats.steps = float(grad_norm), epoch + 1
    optimizer.zero_grad(set_to_none=True)
    return stats


@torch.no_grad()
def _reference_logprobs(reference: Any, batch: Sequences, t_len: int, temperature: float) -> torch.Tensor:
    if reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    return token_logprobs(reference, batch.input_ids, batch.attention_mask, t_len, temperature)
