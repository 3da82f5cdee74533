"""The pool's rows as protocol JSON (docs/protocol.md): what `samples` carries."""

from __future__ import annotations

from typing import Any

from pool.models import Rollout


def rollout_to_protocol(rollout: Rollout) -> dict[str, Any]:
    """A sampled group: verified rewards, and the author node's public name. Needs node loaded."""
    return {
        "id": str(rollout.id),
        "round": rollout.round,
        "task": {"dataset": rollout.dataset, "seed": rollout.seed, "index": rollout.index},
        "question": rollout.question,
        "answer": rollout.answer,
        "completions": rollout.completions,
        "rewards": rollout.verified_rewards,
        "node": rollout.node.name,
    }
