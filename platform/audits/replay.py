"""The audit's replay, as the worker runs it (docs/audits.md, "The worker"): the upload's hash, its
tensors' commitment, the named model rebuilt from the site's own copy with the uploaded weights, and
each sampled group's tokens replayed under them (sapo_node.audit.replay_batch, which a node can run
on itself), up to REPLAY_BATCH_ROWS completions in one pass: the groups' prompts begin with the same
chat template, and that prefix then runs once for them all. Django-free apart from the rows it is
handed; torch is imported here only, by the worker.

The uploaded file is parsed by the safetensors library (a header and raw tensors: no pickle, no code),
or reconstructed from the model's base when it is a difference (sapo_node.weightdiff), only after its
sha256 matched the one the node announced, and its tensors are read only after their weights_digest
matched the commitment.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo_node import proof

#: Completions replayed in one pass at most: the key/value cache each row carries (SmolLM2-135M:
#: about 12 MB for a 200-token prompt and 64 tokens) bounds the worker's memory.
REPLAY_BATCH_ROWS = 32


class AuditFailed(Exception):
    """The node's upload or groups do not hold up: the audit fails with this reason."""


@dataclass(frozen=True)
class GroupToReplay:
    """One covered group as stored: its question's task and texts, and its proof (WireProof's fields)."""

    rollout_id: str
    dataset: str
    seed: int
    index: int
    question: str
    completions: Sequence[str]
    proof: dict[str, Any]


@dataclass
class ReplayReport:
    groups: int = 0
    tokens: int = 0
    notes: list[str] = field(default_factory=list)


def auditable_models() -> frozenset[str]:
    """Models the site rebuilds itself (sapo_node.proof.AUDITABLE_MODELS). The pool stores a proof naming
    any other unaudited, so no audit of one is drawn; this check stands for audits drawn before."""
    return proof.AUDITABLE_MODELS


class BaseUnavailable(RuntimeError):
    """A difference names a base other than this worker's copy, though the site recorded it (another
    worker's copy differs): the site's fault, so the job raises and is retried, and never fails the node."""


#: weights_digest of each model's base as this process built it from the site's copy (load_model).
_BASE_DIGESTS: dict[str, str] = {}


def base_digest(name: str) -> str | None:
    """The digest of `name`'s base weights, once this process has built the model."""
    return _BASE_DIGESTS.get(name)


@functools.lru_cache(maxsize=1)
def _base(name: str, cache_dir: Path) -> tuple[str, dict[str, Any]]:
    from sapo_node.commitments import base_tensors

    digest, tensors = base_tensors(name, cache_dir=cache_dir)
    _BASE_DIGESTS[name] = digest
    return digest, tensors


def load_checkpoint(
    path: Path,
    *,
    sha256: str,
    weights: str,
    model: str = "",
    cache_dir: Path | None = None,
    max_bytes: int = 1 << 30,
) -> dict[str, Any]:
    """The upload's tensors, once its bytes match `sha256` and its tensors the commitment `weights`. A
    difference from `model`'s base (sapo_node.weightdiff) is reconstructed from the site's own copy in
    `cache_dir`, at most `max_bytes` of tensors, and checked against `weights` like a whole file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from sapo_node import weightdiff
    from sapo_node.commitments import tensors_digest

    if proof.file_sha256(path) != sha256:
        raise AuditFailed("the stored checkpoint does not match the sha256 its upload announced")
    if weightdiff.is_diff(path):
        if model not in auditable_models():
            raise AuditFailed(f"the model {model!r} is not one the site can rebuild (built-in or packaged models only)")
        digest, base = _base(model, Path(cache_dir) if cache_dir else None)
        try:
            tensors = weightdiff.read_diff(path, base, base_digest=digest, max_bytes=max_bytes)
        except weightdiff.DiffError as exc:
            if exc.code == "unknown_base":
                raise BaseUnavailable(f"{model}'s base here is {digest[:12]}, not the difference's") from None
            raise AuditFailed(f"the checkpoint difference is refused ({exc.code}: {str(exc)[:200]})") from None
    else:
        try:
            tensors = load_file(str(path), device="cpu")
        except (SafetensorError, ValueError, OSError) as exc:
            raise AuditFailed(f"the checkpoint is not a safetensors file of tensors: {str(exc)[:200]}") from None
    if tensors_digest(tensors) != weights:
        raise AuditFailed("the checkpoint's weights_digest is not the digest its groups committed to")
    return tensors


def load_model(name: str, tensors: dict[str, Any], *, cache_dir: Path) -> tuple[Any, Any]:
    """The named model's architecture and tokenizer from the site's own copy, in float32 on the CPU,
    with the uploaded weights."""
    import torch

    from sapo_node.commitments import model_tensors, tensors_digest
    from sapo_node.models import load_policy

    if name not in auditable_models():
        raise AuditFailed(f"the model {name!r} is not one the site can rebuild (built-in or packaged models only)")
    model, tokenizer, _ = load_policy(name, device="cpu", cache_dir=cache_dir, dtype=torch.float32)
    if name not in _BASE_DIGESTS:  # the site's base, for the differences it may take (audits.models.AuditBase)
        _BASE_DIGESTS[name] = tensors_digest(model_tensors(model))
    state = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in tensors.items()}
    expected = model.state_dict()
    if set(state) != set(expected) or any(tuple(state[k].shape) != tuple(expected[k].shape) for k in expected):
        raise AuditFailed(f"the checkpoint's tensors are not those of {name} (names or shapes differ)")
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, tokenizer


def tolerances_for(tensors: dict[str, Any]) -> tuple[float, float]:
    """(eps, logprob_tol) for completions generated by these uploaded weights
    (sapo_node.audit.tolerances): a half-precision tensor among them means the node generated in half
    precision, whose logits the float32 replay matches less closely (docs/benchmarks.md, "Audit
    replay")."""
    import torch

    from sapo_node import audit

    halves = {t.dtype for t in tensors.values() if t.dtype in (torch.bfloat16, torch.float16)}
    return audit.tolerances(next(iter(halves)) if halves else torch.float32)


def replay_groups(
    model: Any,
    tokenizer: Any,
    groups: Sequence[GroupToReplay],
    *,
    max_tokens: int,
    tolerances: tuple[float, float] | None = None,
) -> ReplayReport:
    """Replay every completion of `groups` (their tokens at most `max_tokens` in all: a group that
    would pass the bound is left out) within `tolerances` (eps, logprob_tol; None: float32's); raises
    AuditFailed at the first group that does not hold up."""
    from sapo_node import audit, proof
    from sapo_node.generate import encode_prompt, refused_tokens, stop_ids
    from sapo_node.prompts import format_prompt

    eps, logprob_tol = tolerances or (audit.EPS, audit.LOGPROB_TOL)
    report = ReplayReport()
    stops = stop_ids(model, tokenizer)
    refused = refused_tokens(tokenizer, model.config.vocab_size, "cpu", stops)
    batch: list[tuple[GroupToReplay, int, audit.GroupInput]] = []

    def replay_pending() -> None:
        """Replays `batch` in one pass and raises at its first group (in order) that fails."""
        try:
            verdicts = audit.replay_batch(
                model, tokenizer, [g for _, _, g in batch], refused=refused, eps=eps, logprob_tol=logprob_tol
            )
        except audit.ReplayInputError as exc:
            name = batch[exc.index][0].rollout_id
            raise AuditFailed(f"group {name}: not a completion of this model ({exc})") from None
        for (group, size, _), results in zip(batch, verdicts, strict=True):
            for k, result in enumerate(results):
                if not result.passed:
                    raise AuditFailed(
                        f"group {group.rollout_id}, completion {k}: token {result.failed_at} is not the seeded draw "
                        f"of the committed weights ({result.reason}, margin {result.margin:.3g})"
                    )
            report.tokens += size
            report.groups += 1
        batch.clear()

    taken = 0  # tokens of the groups read so far that are within the bound
    for group in groups:
        p = group.proof
        n = len(group.completions)
        try:
            rows = [proof.decode_ids(t) for t in p["tokens"]]
            claimed = [proof.decode_floats(lp) for lp in p["logprobs"]]
            challenge, temperature = str(p["challenge"]), float(p["temperature"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditFailed(f"group {group.rollout_id}: its stored proof is unreadable ({exc})") from None
        if len(rows) != n or len(claimed) != n:
            raise AuditFailed(f"group {group.rollout_id}: its proof does not have one token list per completion")
        size = sum(map(len, rows))
        if taken + size > max_tokens:
            report.notes.append(f"left out group {group.rollout_id}: past SAPO_AUDIT_MAX_TOKENS")
            continue
        taken += size
        for k, (ids, text) in enumerate(zip(rows, group.completions, strict=True)):
            if tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True) != text:
                raise AuditFailed(f"group {group.rollout_id}, completion {k}: its tokens do not decode to its text")
        prompt_ids = encode_prompt(tokenizer, format_prompt(tokenizer, group.question))
        keys = [proof.completion_key(challenge, group.dataset, group.seed, group.index, k) for k in range(n)]
        if batch and sum(len(g.completions) for _, _, g in batch) + n > REPLAY_BATCH_ROWS:
            replay_pending()
        batch.append((group, size, audit.GroupInput(prompt_ids, rows, keys, temperature, claimed)))
    if batch:
        replay_pending()
    return report
