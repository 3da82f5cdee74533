"""The audit's replay, as the worker runs it (docs/audits.md, "The worker"): the upload's hash, its
tensors' commitment, the named model rebuilt from the site's own copy with the uploaded weights, and
each sampled group's tokens replayed under them (sapo_node.audit.replay, the function a node can run
on itself). Django-free apart from the rows it is handed; torch is imported here only, by the worker.

The uploaded file is parsed by the safetensors library (a header and raw tensors: no pickle, no code)
only after its sha256 matched the one the node announced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Models the site rebuilds itself: the built-in ones and those a package ships (the node client's
#: lists). Weights of any other model cannot be replayed here.
READ_CHUNK = 1 << 20


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


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def auditable_models() -> set[str]:
    from sapo_node.packaged import PACKAGED
    from sapo_node.tiny import VARIANTS

    return set(VARIANTS) | set(PACKAGED)


def load_checkpoint(path: Path, *, sha256: str, weights: str) -> dict[str, Any]:
    """The upload's tensors, once its bytes match `sha256` and its tensors the commitment `weights`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from sapo_node.commitments import tensors_digest

    if file_sha256(path) != sha256:
        raise AuditFailed("the stored checkpoint does not match the sha256 its upload announced")
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

    from sapo_node.models import load_policy

    if name not in auditable_models():
        raise AuditFailed(f"the model {name!r} is not one the site can rebuild (built-in or packaged models only)")
    model, tokenizer, _ = load_policy(name, device="cpu", cache_dir=cache_dir, dtype=torch.float32)
    state = {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in tensors.items()}
    expected = model.state_dict()
    if set(state) != set(expected) or any(tuple(state[k].shape) != tuple(expected[k].shape) for k in expected):
        raise AuditFailed(f"the checkpoint's tensors are not those of {name} (names or shapes differ)")
    model.load_state_dict(state, strict=True)
    model.eval()
    return model, tokenizer


def replay_groups(model: Any, tokenizer: Any, groups: Sequence[GroupToReplay], *, max_tokens: int) -> ReplayReport:
    """Replay every completion of `groups` (their tokens at most `max_tokens` in all); raises
    AuditFailed at the first completion that does not hold up."""
    import torch

    from sapo_node import proof
    from sapo_node.audit import replay
    from sapo_node.generate import encode_prompt, refused_tokens, stop_ids
    from sapo_node.prompts import format_prompt

    report = ReplayReport()
    stops = stop_ids(model, tokenizer)
    vocab = model.get_output_embeddings().weight.shape[0]
    refused = refused_tokens(tokenizer, vocab, "cpu", stops)
    torch.set_grad_enabled(False)
    for group in groups:
        p = group.proof
        tokens, logprobs = p.get("tokens") or [], p.get("logprobs") or []
        if len(tokens) != len(group.completions) or len(logprobs) != len(group.completions):
            raise AuditFailed(f"group {group.rollout_id}: its proof does not have one token list per completion")
        prompt_ids = encode_prompt(tokenizer, format_prompt(tokenizer, group.question))
        for k, text in enumerate(group.completions):
            ids = proof.decode_ids(tokens[k])
            if report.tokens + len(ids) > max_tokens:
                report.notes.append(f"stopped at {report.tokens} tokens (SAPO_AUDIT_MAX_TOKENS)")
                return report
            decoded = tokenizer.decode([t for t in ids if t not in stops], skip_special_tokens=True)
            if decoded != text:
                raise AuditFailed(f"group {group.rollout_id}, completion {k}: its tokens do not decode to its text")
            key = proof.completion_key(p["challenge"], group.dataset, group.seed, group.index, k)
            result = replay(
                model,
                tokenizer,
                prompt_ids,
                ids,
                proof.uniforms(key, len(ids)),
                float(p["temperature"]),
                refused,
                logprobs=proof.decode_floats(logprobs[k]),
            )
            if not result.ok:
                raise AuditFailed(f"group {group.rollout_id}, completion {k}: {result.reason}")
            report.tokens += len(ids)
        report.groups += 1
    return report
