"""Replaying a completion: given the weights that generated it, its prompt and its sampling key, is
each of its tokens the one the seeded draw picks (sapo_node.generate, docs/protocol.md, "Sampling")?

One teacher-forced forward pass (no cache) over prompt + completion gives the distribution every
completion token was drawn from. Token t passes when the draw's target, u * cdf[-1] with
u = proof.uniforms(key, n)[t], lies within the token's cdf interval [cdf[t-1], cdf[t]] widened by
`eps` on each side, and its claimed log-probability (when given) is within `logprob_tol` of the
replayed one. The widening absorbs floating-point differences between the generating machine and
the auditing one (another device, dtype, batch or kernel): bench/audit_replay.py measures how large
they get (docs/benchmarks.md, "Audit replay"). At temperature 0 the token must be the argmax: its
probability at temperature 1 at most `eps` below the largest other.

No Django and no I/O: the server's audit worker and a node checking itself call the same function.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sapo_node import proof
from sapo_node.generate import refused_tokens, stop_ids

#: Half-width of the band around a token's cdf interval that the draw may fall in and still pass:
#: floating-point noise between machines (docs/benchmarks.md, "Audit replay", measures it).
EPS = 0.02
#: How far a claimed per-token log-probability may be from the replayed one (nats).
LOGPROB_TOL = 0.25
#: Completion positions whose logits are materialised at once: a (rows, chunk, V) float64 cdf.
CHUNK = 64


@dataclass(frozen=True)
class Replay:
    """What replaying one completion found. `margin` is the worst token's: for a sampled token,
    how far the draw's target lies inside its cdf interval (negative: outside, by that much); at
    temperature 0, its probability minus the largest other's. `logprob_error` is the largest
    |claimed - replayed| log-probability (0 when none were claimed). `failed_at` is the first
    failing position (None: passed), `reason` why ("token", "logprob", "stop", "" when passed)."""

    tokens: int
    margin: float
    logprob_error: float
    failed_at: int | None
    reason: str

    @property
    def passed(self) -> bool:
        return self.failed_at is None


def model_digest(model: Any) -> str:
    """proof.weights_digest over the model's state_dict: each tensor's CPU bytes in its own dtype."""

    def tensors():
        for name, tensor in model.state_dict().items():
            t = tensor.detach().cpu().contiguous()
            # Raw bytes whatever the dtype (bfloat16 has no numpy dtype): a flat view as uint8.
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
            yield name, str(t.dtype).removeprefix("torch."), tuple(t.shape), data

    return proof.weights_digest(tensors())


def replay(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    key: bytes,
    temperature: float,
    *,
    logprobs: Sequence[float] | None = None,
    refused: torch.Tensor | None = None,
    eps: float = EPS,
    logprob_tol: float = LOGPROB_TOL,
) -> Replay:
    """Replay one completion (see the module docstring). The model runs in the dtype it is in: the
    audit's is float32 (measured against bfloat16 generation in docs/benchmarks.md)."""
    return replay_groups(
        model,
        tokenizer,
        prompt_ids,
        [completion_ids],
        [key],
        temperature,
        logprobs=None if logprobs is None else [logprobs],
        refused=refused,
        eps=eps,
        logprob_tol=logprob_tol,
    )[0]


@torch.inference_mode()
def replay_groups(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    completions: Sequence[Sequence[int]],
    keys: Sequence[bytes],
    temperature: float,
    *,
    logprobs: Sequence[Sequence[float]] | None = None,
    refused: torch.Tensor | None = None,
    eps: float = EPS,
    logprob_tol: float = LOGPROB_TOL,
) -> list[Replay]:
    """`replay` for the completions of one prompt (a group) at once: one forward pass over the rows,
    right-padded (a causal model's earlier positions do not see the padding). ValueError when the
    input cannot be a completion of this model (empty, an id outside the vocabulary, longer than
    its positions, counts that do not match)."""
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError("temperature must be finite and >= 0")
    if len(keys) != len(completions) or (logprobs is not None and len(logprobs) != len(completions)):
        raise ValueError("one key (and one log-probability list) per completion")
    vocab = model.config.vocab_size
    limit = getattr(model.config, "max_position_embeddings", None)
    prompt = list(prompt_ids)
    rows = [list(c) for c in completions]
    for i, row in enumerate(rows):
        if not prompt or not row:
            raise ValueError("empty prompt or completion")
        if logprobs is not None and len(logprobs[i]) != len(row):
            raise ValueError("one log-probability per completion token")
        if limit is not None and len(prompt) + len(row) > limit:
            raise ValueError(f"prompt + completion is longer than the model's {limit} positions")
    if any(not 0 <= t < vocab for t in prompt) or any(not 0 <= t < vocab for row in rows for t in row):
        raise ValueError("a token id outside the model's vocabulary")

    device = next(model.parameters()).device
    stops = stop_ids(model, tokenizer)
    if refused is None:
        refused = refused_tokens(tokenizer, vocab, device, stops)
    refused = refused.to(device)
    n, p = len(rows), len(prompt)
    width = p + max(map(len, rows))
    input_ids = torch.full((n, width), 0, dtype=torch.long, device=device)
    mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, row in enumerate(rows):
        input_ids[i, : p + len(row)] = torch.tensor(prompt + row)
        mask[i, : p + len(row)] = 1
    model.eval()
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
    head = model.get_output_embeddings()

    results = []
    for i, row in enumerate(rows):
        u = proof.uniforms(keys[i], len(row))
        margins: list[float] = []
        errors: list[float] = []
        for start in range(0, len(row), CHUNK):
            ids = torch.tensor(row[start : start + CHUNK], device=device)  # (C,)
            # Completion token t is predicted at position p + t - 1.
            logits = head(hidden[i, p - 1 + start : p - 1 + start + len(ids)]).float()  # (C, V)
            logits = logits.masked_fill(refused, -torch.inf)
            uu = torch.tensor(u[start : start + len(ids)], dtype=torch.float64, device=device)
            m, lp = _margins(logits, ids, uu, temperature)
            m = torch.where(refused[ids], -math.inf, m)  # a refused token is never drawn
            margins += m.tolist()
            if logprobs is not None:
                claimed = torch.tensor(logprobs[i][start : start + len(ids)], dtype=torch.float64, device=device)
                err = (claimed - lp.double()).abs()
                errors += torch.where(torch.isfinite(err), err, math.inf).tolist()
        results.append(_verdict(row, margins, errors, stops, eps, logprob_tol))
    return results


def _margins(
    logits: torch.Tensor, ids: torch.Tensor, u: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, V) masked float32 logits, (C,) drawn ids and (C,) uniforms -> each token's (C,) float64
    margin and (C,) float32 replayed log-probability, computed as generate.sample_tokens draws."""
    if temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)  # (C, V)
        prob = logp.double().exp()
        own = prob.gather(-1, ids[:, None]).squeeze(1)
        others = prob.scatter(-1, ids[:, None], -1.0).amax(-1)
        return own - others, logp.gather(-1, ids[:, None]).squeeze(1)
    scaled = logits / temperature
    cdf = torch.cumsum(torch.softmax(scaled, dim=-1), dim=-1, dtype=torch.float64)  # (C, V)
    hi = cdf.gather(-1, ids[:, None]).squeeze(1)
    lo = torch.where(ids > 0, cdf.gather(-1, (ids - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    target = u * cdf[:, -1]
    margin = torch.minimum(target - lo, hi - target)
    return margin, torch.log_softmax(scaled, dim=-1).gather(-1, ids[:, None]).squeeze(1)


def _verdict(
    row: list[int], margins: list[float], errors: list[float], stops: set[int], eps: float, logprob_tol: float
) -> Replay:
    failed_at, reason = None, ""
    for t, m in enumerate(margins):
        if t < len(row) - 1 and row[t] in stops:
            failed_at, reason = t, "stop"  # generation ends at its first stop token
        elif not m >= -eps:
            failed_at, reason = t, "token"
        elif errors and not errors[t] <= logprob_tol:
            failed_at, reason = t, "logprob"
        if failed_at is not None:
            break
    return Replay(
        tokens=len(row),
        margin=min(margins),
        logprob_error=max(errors, default=0.0),
        failed_at=failed_at,
        reason=reason,
    )
