"""Step 6 of a round: the GRPO update.

The maths is in three pure functions tested with hand-computed tensors:
  group_advantages  (r - mean) / (std + eps) within a group (or against the node's own baseline,
                    baseline_advantages, for external groups with external_baseline = own)
  clipped_loss      token-level clipped-ratio loss (DAPO's token mean, clip-higher), optional k3 KL
  token_logprobs    log-probs of the completion tokens under a model, one full forward per sequence
  importance_weights  the truncated importance weights of external completions that carry their
                    sharer's log-probabilities (TIS, per token or per sequence), and the filter of
                    off-policy negative-advantage completions (F-TIS); 1 for everything else
`grpo_update` strings them together: one optimizer step per epoch over the whole training set,
gradients accumulated over micro-batches. The "old" log-probs are those of the policy before the
update: the first epoch's forward pass computes them (so its ratio is exactly 1: no separate
forward pass) and later epochs reuse them.

The update computes the same log-probs as `token_logprobs` with less work (`completion_logprobs`,
tested against it to 1e-6 in loss and gradient):
  - the G completions of a group share their prompt: it goes through the model once per micro-batch
    and its key/value cache is copied to the G rows (gradients flow back through the copy), so the
    prompt's tokens, usually most of a sequence, cost 1/G of what they did; and the micro-batch's
    prompts' shared beginning (a chat model's system message and worked turns) goes through once for
    all of them, the same way (sapo_node.shared_prefix);
  - the LM head is applied only at completion positions that hold a token (not over the prompt, not
    over padding), and each token's log-prob is its logit minus a logsumexp, in chunks of positions,
    with the chunk's logits recomputed in the backward pass instead of kept: no (N, T, V) logits,
    log-softmax or gradient tensor is ever materialised (V is 151k for Qwen);
  - rows are ordered by prompt length so the micro-batches pad little.
A model whose forward does more than `lm_head(hidden)` (logit soft-capping, scaling) falls back to
`token_logprobs`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from sapo_node.baseline import MAX_ADVANTAGE
from sapo_node.groups import TrainGroup
from sapo_node.shared_prefix import completion_hidden, prompt_layout, prompt_pass

ADVANTAGE_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, eps: float = ADVANTAGE_EPS) -> torch.Tensor:
    """(..., G) -> (..., G): rewards normalised within each group by its mean and sample std.

    A group whose rewards all agree gets zero advantages (it carries no signal).
    """
    mean = rewards.mean(dim=-1, keepdim=True)  # (..., 1)
    std = rewards.std(dim=-1, keepdim=True)  # (..., 1), unbiased like TRL and verl
    return (rewards - mean) / (std + eps)


def baseline_advantages(
    rewards: torch.Tensor, baseline: float, eps: float = ADVANTAGE_EPS, bound: float = MAX_ADVANTAGE
) -> torch.Tensor:
    """(G,) -> (G,): rewards against a baseline from outside the group (sapo_node.baseline), scaled
    by the group's sample std like group_advantages and clamped to [-bound, bound]."""
    std = rewards.std(dim=-1, keepdim=True)
    return ((rewards - baseline) / (std + eps)).clamp(-bound, bound)


def train_group_advantages(group: TrainGroup) -> list[float]:
    """The advantage of each completion of a training group: within the group, or against its baseline."""
    rewards = torch.tensor(group.rewards, dtype=torch.float32)
    if group.baseline is None:
        return group_advantages(rewards).tolist()
    return baseline_advantages(rewards, group.baseline).tolist()


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
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective to minimise, averaged over completion tokens (DAPO's token-level mean).

    logp, old_logp, ref_logp, mask: (N, T); advantages: (N,). `num_tokens` is the denominator
    (default: mask.sum()); give the whole training set's token count when accumulating micro-batches.
    `weights` (N, T), detached, multiply each token's clipped policy-gradient term (not the KL
    penalty): `importance_weights`; None is weight 1 everywhere.
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
    if weights is not None:
        per_token = per_token * weights

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


#: What `importance_weights` does with external completions: off (trained as if sampled by this
#: node, the paper's), token (TIS per token), sequence (TIS per completion).
CORRECTIONS = ("off", "token", "sequence")


def importance_weights(
    old_logp: torch.Tensor,
    sharer_logp: torch.Tensor,
    has_sharer: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    correction: str = "off",
    cap: float = 2.0,
    filter_kl: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(N, T) weights of each token's policy-gradient term, for completions another policy sampled.

    old_logp, sharer_logp, mask: (N, T), the policy before the update and the sharer's logged
    log-probabilities of the same tokens; has_sharer, advantages: (N,). A row without the sharer's
    log-probabilities (an own completion, an external one trained uncorrected) gets weight 1 exactly.
    For the others, with log-ratio l_t = old_logp_t - sharer_logp_t (the node's policy over the
    sharer's sampling, truncated importance sampling):
      token     w_t = min(exp(l_t), cap)
      sequence  w_t = min(exp(sum_t l_t), cap) for every token of the completion
      off       w_t = 1
    With `filter_kl`, a row of negative advantage whose mean of -l_t over its tokens (the k1 estimate
    of KL(sharer || node) per token) exceeds it gets weight 0 (F-TIS: pushing down tokens this node
    would rarely sample costs much and teaches little). The denominator of the loss is unchanged.
    Returns (weights, stats): stats' corrected (rows weighted), filtered (rows set to 0) and
    weight_sum (the sum of the corrected rows' token weights before filtering)."""
    mask = mask.to(old_logp.dtype)
    ext = has_sharer[:, None].to(old_logp.dtype)  # (N, 1)
    log_ratio = (old_logp - sharer_logp) * mask * ext  # (N, T), 0 where not applicable
    if correction == "token":
        w = torch.exp(log_ratio).clamp(max=cap)
    elif correction == "sequence":
        w = torch.exp(log_ratio.sum(dim=-1, keepdim=True)).clamp(max=cap).expand_as(log_ratio)
    elif correction == "off":
        w = torch.ones_like(log_ratio)
    else:
        raise ValueError(f"correction must be one of {CORRECTIONS}")
    w = torch.where(ext.bool(), w, torch.ones_like(w))  # (N, T)
    zero = log_ratio.new_zeros(())
    corrected = correction != "off"
    stats = {
        "corrected": ext.sum() if corrected else zero,
        "weight_sum": (w * mask * ext).sum() if corrected else zero,
        "filtered": zero,
    }
    if filter_kl is not None:
        kl = -log_ratio.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)  # (N,)
        drop = has_sharer.bool() & (advantages < 0) & (kl > filter_kl)  # (N,)
        w = torch.where(drop[:, None], torch.zeros_like(w), w)
        stats["filtered"] = drop.to(w.dtype).sum()
    return w.detach(), {k: v.detach() for k, v in stats.items()}


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
    logits = _at_least_float32(logits[:, :-1, :]) / temperature  # position t predicts token t + 1
    targets = input_ids[:, -completion_len:]  # (N, T)
    return torch.gather(logits.log_softmax(dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)  # (N, T)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Log-softmax in float32 for bf16/fp16 models (as generation samples), float64 kept as is."""
    return x if x.dtype == torch.float64 else x.float()


@dataclass
class Sequences:
    """A micro-batch laid out for `token_logprobs`, with each sequence's advantage."""

    input_ids: torch.Tensor  # (N, P + T)
    attention_mask: torch.Tensor  # (N, P + T)
    completion_mask: torch.Tensor  # (N, T)
    advantages: torch.Tensor  # (N,)


@dataclass
class GroupedBatch:
    """A micro-batch laid out for `completion_logprobs`: each distinct prompt once, and the rows
    (completions) that continue it."""

    prompt_ids: torch.Tensor  # (K, P): the shared prefix, padding, each prompt's own tokens (prompt_layout)
    prompt_mask: torch.Tensor  # (K, P)
    owner: torch.Tensor  # (N,) index of each row's prompt
    completion_ids: torch.Tensor  # (N, T) right padded
    completion_mask: torch.Tensor  # (N, T)
    advantages: torch.Tensor  # (N,)
    shared: int = 0  # leading columns every prompt shares (0: plain left padding)

    def sequences(self) -> Sequences:
        """The same rows laid out for `token_logprobs` (prompt + completion per row)."""
        return Sequences(
            input_ids=torch.cat([self.prompt_ids[self.owner], self.completion_ids], dim=1),
            attention_mask=torch.cat([self.prompt_mask[self.owner], self.completion_mask], dim=1),
            completion_mask=self.completion_mask,
            advantages=self.advantages,
        )


def collate_groups(rows: list[tuple[list[int], list[int], float]], pad: int, device: Any) -> GroupedBatch:
    """(prompt ids, completion ids, advantage) rows -> distinct left-padded prompts, right-padded
    completions. Rows with equal prompt ids share one prompt row."""
    index: dict[tuple[int, ...], int] = {}
    for prompt, _, _ in rows:
        index.setdefault(tuple(prompt), len(index))
    prompt_ids, prompt_mask, shared = prompt_layout(list(index), pad, device)
    t_len = max(max(len(c) for _, c, _ in rows), 1)
    return GroupedBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        shared=shared,
        owner=torch.tensor([index[tuple(p)] for p, _, _ in rows], device=device),
        completion_ids=torch.tensor([c + [pad] * (t_len - len(c)) for _, c, _ in rows], device=device),
        completion_mask=torch.tensor([[1] * len(c) + [0] * (t_len - len(c)) for _, c, _ in rows], device=device),
        advantages=torch.tensor([a for _, _, a in rows], dtype=torch.float32, device=device),
    )


#: Positions per LM-head chunk: chunk x vocabulary logits (float32) stay near 64 MiB.
HEAD_CHUNK_ELEMENTS = 2**24

#: Config fields of models whose logits are not plain lm_head(hidden) (as listed by TRL's fused head).
_LOGIT_MODIFIERS = (
    "final_logit_softcapping",
    "logit_scale",
    "output_multiplier",
    "lm_head_multiplier",
    "logits_scaling",
)
_plain_heads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def plain_lm_head(model: Any) -> torch.nn.Linear | None:
    """The model's LM head if its logits are exactly `lm_head(base_model(...).last_hidden_state)`, else None.

    Checked once per model: no logit modifier in its config, a Linear output embedding, and the two
    computations agreeing on a two-token input."""
    if model in _plain_heads:
        return _plain_heads[model]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    plain = (
        isinstance(head, torch.nn.Linear)
        and getattr(model, "base_model", model) is not model
        and all(getattr(text_config, name, None) in (None, 1.0) for name in _LOGIT_MODIFIERS)
    )
    if plain:
        device = head.weight.device
        ids = torch.tensor([[0, 1]], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()
            hidden = model.base_model(input_ids=ids).last_hidden_state
            plain = torch.allclose(head(hidden).float(), logits, rtol=1e-3, atol=1e-3)
    _plain_heads[model] = head if plain else None
    return _plain_heads[model]


class _TargetLogprobs(torch.autograd.Function):
    """log softmax(hidden @ W.T + b) / temperature)[target] for (M, H) hidden states, in chunks of
    positions; the backward pass recomputes each chunk's logits instead of keeping (M, V) of them."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk):  # noqa: ANN001, ANN205
        logps, lses = [], []
        for h, t in zip(hidden.split(chunk), targets.split(chunk), strict=True):
            logits = _at_least_float32(F.linear(h, weight, bias)) / temperature  # (C, V)
            lse = logits.logsumexp(dim=-1)  # (C,)
            logps.append(logits.gather(1, t[:, None]).squeeze(1) - lse)
            lses.append(lse)
        ctx.save_for_backward(hidden, weight, bias, targets, torch.cat(lses))
        ctx.temperature, ctx.chunk = temperature, chunk
        return torch.cat(logps)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias) if bias is not None and ctx.needs_input_grad[2] else None
        start = 0
        for h, t, g, s in zip(
            hidden.split(ctx.chunk), targets.split(ctx.chunk), grad.split(ctx.chunk), lse.split(ctx.chunk), strict=True
        ):
            logits = _at_least_float32(F.linear(h, weight, bias)) / ctx.temperature
            # d logp[t] / d logits = onehot(t) - softmax(logits), times the incoming gradient, / temperature
            g_logits = torch.exp(logits - s[:, None]).mul_(-g[:, None])
            g_logits.scatter_add_(1, t[:, None], g[:, None])
            g_logits = g_logits.div_(ctx.temperature).to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + len(h)] = g_logits @ weight
            if grad_weight is not None:
                grad_weight += g_logits.T @ h
            if grad_bias is not None:
                grad_bias += g_logits.sum(0)
            start += len(h)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def target_logprobs(
    hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """(M, H) hidden states and (M,) target ids -> (M,) log-probs of the targets under `head`."""
    chunk = max(1, HEAD_CHUNK_ELEMENTS // head.weight.shape[0])
    return _TargetLogprobs.apply(hidden, head.weight, head.bias, targets, temperature, chunk)


def completion_logprobs(model: Any, batch: GroupedBatch, temperature: float = 1.0) -> torch.Tensor:
    """(N, T) log-probs of the completion tokens (0 at padding), equal to `token_logprobs` on the
    same rows; see the module docstring for how it saves work."""
    head = plain_lm_head(model)
    if head is None:
        seqs = batch.sequences()
        logp = token_logprobs(model, seqs.input_ids, seqs.attention_mask, batch.completion_ids.shape[1], temperature)
        return logp * batch.completion_mask
    backbone = model.base_model
    out = prompt_pass(backbone, batch.prompt_ids, batch.prompt_mask, batch.shared)
    hidden = completion_hidden(
        backbone, out, batch.prompt_mask, batch.owner, batch.completion_ids, batch.completion_mask
    )  # (N, T, H)
    keep = batch.completion_mask.bool()
    logp = target_logprobs(hidden[keep], head, batch.completion_ids[keep], temperature)  # (M,)
    return logp.new_zeros(keep.shape).masked_scatter(keep, logp)


def make_optimizer(model: Any, lr: float, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with torch's fused kernel where it has one (CPU, CUDA):
    one pass over all parameters instead of several small operations per tensor, a few times faster
    for the tiny models on one CPU thread (docs/benchmarks.md, "Node round"). Same update rule."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None)


@dataclass
class UpdateStats:
    loss: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    grad_norm: float = 0.0
    tokens: int = 0
    sequences: int = 0
    steps: int = 0
    #: External completions weighted by the importance correction, and the mean of their token weights.
    corrected: int = 0
    correction_weight: float = 0.0
    #: External completions of negative advantage the off-policy filter set to weight 0.
    filtered: int = 0


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
    correction: str = "off",
    correction_cap: float = 2.0,
    filter_kl: float | None = None,
) -> UpdateStats:
    """Train `model` on `groups` (each must have at least two completions). Returns the last epoch's
    loss and clip fraction; no step is taken when `groups` is empty. External groups that carry their
    sharer's log-probabilities are weighted by `importance_weights` (correction, correction_cap,
    filter_kl); the rest train exactly as without them."""
    rows = []
    sharer: list[list[float] | None] = []
    # Ordered by prompt length so each micro-batch pads its prompts little; the loss is a sum over
    # tokens divided by the whole set's token count, so the order does not change it.
    for group in sorted(groups, key=lambda g: len(g.prompt_ids)):
        adv = train_group_advantages(group)
        rows += [(group.prompt_ids, ids, a) for ids, a in zip(group.completion_ids, adv, strict=True)]
        sharer += group.sharer_logprobs or [None] * len(group.completion_ids)
    stats = UpdateStats(sequences=len(rows), tokens=sum(len(c) for _, c, _ in rows))
    weighing = any(lps is not None for lps in sharer) and (correction != "off" or filter_kl is not None)
    if not rows or stats.tokens == 0:
        return stats
    if kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")

    device = next(model.parameters()).device
    batches = [collate_groups(rows[i : i + micro_batch], pad_id, device) for i in range(0, len(rows), micro_batch)]
    old: list[torch.Tensor] = []
    ref: list[torch.Tensor | None] = []
    weights: list[torch.Tensor | None] = []
    weighed = torch.zeros(3, device=device)  # corrected, weight sum, filtered
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()  # no dropout: the ratio must compare the same function
    for epoch in range(epochs):
        optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(3, device=device)  # loss, clip fraction, kl: read once per epoch, not per micro-batch
        for i, batch in enumerate(batches):
            logp = completion_logprobs(model, batch, temperature)  # (N, T)
            if epoch == 0:
                old.append(logp.detach())  # the policy before the update: the first epoch's ratio is exactly 1
                ref.append(_reference_logprobs(reference, batch, temperature) if kl_coef else None)
                weights.append(None)
                if weighing:
                    start = i * micro_batch
                    sharer_logp, has_sharer = collate_sharer(sharer[start : start + micro_batch], batch, device)
                    weights[i], w = importance_weights(
                        old[i],
                        sharer_logp,
                        has_sharer,
                        batch.advantages,
                        batch.completion_mask,
                        correction=correction,
                        cap=correction_cap,
                        filter_kl=filter_kl,
                    )
                    weighed += torch.stack([w["corrected"], w["weight_sum"], w["filtered"]])
            loss, s = clipped_loss(
                logp,
                old[i],
                batch.advantages,
                batch.completion_mask,
                eps_low=eps_low,
                eps_high=eps_high,
                ref_logp=ref[i],
                kl_coef=kl_coef,
                num_tokens=stats.tokens,
                weights=weights[i],
            )
            loss.backward()
            sums += torch.stack([loss.detach(), s["clip_fraction"], s["kl"]])
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        stats.loss, stats.clip_fraction, stats.kl = sums.tolist()
        stats.grad_norm, stats.steps = float(grad_norm), epoch + 1
    optimizer.zero_grad(set_to_none=True)
    if weighing:
        corrected, weight_sum, filtered = weighed.tolist()
        corrected_tokens = sum(len(c) for (_, c, _), lps in zip(rows, sharer, strict=True) if lps is not None)
        stats.corrected, stats.filtered = int(corrected), int(filtered)
        stats.correction_weight = weight_sum / corrected_tokens if corrected and corrected_tokens else 0.0
    return stats


def collate_sharer(
    rows: list[list[float] | None], batch: GroupedBatch, device: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sharer's log-probabilities of a micro-batch's rows, laid out like its completions: (N, T)
    float32, 0 at padding and on rows without them, and (N,) bool, which rows have them."""
    t_len = batch.completion_ids.shape[1]
    padded = [(lps or []) + [0.0] * (t_len - len(lps or [])) for lps in rows]
    return (
        torch.tensor(padded, dtype=torch.float32, device=device),
        torch.tensor([lps is not None for lps in rows], device=device),
    )


@torch.no_grad()
def _reference_logprobs(reference: Any, batch: GroupedBatch, temperature: float) -> torch.Tensor:
    return completion_logprobs(reference, batch, temperature)
