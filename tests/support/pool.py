"""Shared helpers for the pool tests (no tests here): real groups built with sapo_node.tasks."""

from __future__ import annotations

import json
import uuid
from typing import Any

from pool.limits import Limits
from pool.messages import RolloutIn
from sapo_node.ids import uuid7
from sapo_node.tasks import CATALOGUES, build_entry, score_completion

SAPO = CATALOGUES["sapo"]
EASY = CATALOGUES["easy"]


def make_group(
    dataset: str = "basic_arithmetic",
    *,
    seed: int = 1234,
    index: int = 7,
    right: int = 2,
    wrong: int = 2,
    catalogue=SAPO,
    round_: int = 1,
    rollout_id: str | None = None,
) -> dict[str, Any]:
    """A group as an honest node shares it: `right` correct and `wrong` incorrect completions, real scores."""
    spec = catalogue.get(dataset)
    entry = build_entry(spec, seed, index)
    answer = entry["answer"]
    completions = [f"Let me think. <answer>{answer}</answer>" for _ in range(right)]
    completions += [f"I guess <answer>wrong {i}</answer>" for i in range(wrong)]
    return {
        "id": rollout_id or str(uuid7()),
        "round": round_,
        "task": {"dataset": dataset, "seed": seed, "index": index},
        "question": entry["question"],
        "answer": answer,
        "completions": completions,
        "rewards": [score_completion(spec, seed, entry, c) for c in completions],
    }


def to_rollout_in(group: dict[str, Any]) -> RolloutIn:
    return RolloutIn(
        id=uuid.UUID(group["id"]),
        round=group["round"],
        dataset=group["task"]["dataset"],
        seed=group["task"]["seed"],
        index=group["task"]["index"],
        question=group["question"],
        answer=group["answer"],
        completions=tuple(group["completions"]),
        rewards=tuple(group["rewards"]),
    )


def share_frame(*groups: dict[str, Any], ref: str | None = None) -> dict[str, Any]:
    frame = {"type": "share", "v": 1, "rollouts": list(groups)}
    if ref:
        frame["ref"] = ref
    return frame


DEFAULT_LIMITS = Limits()


def sampled(node, n: int, *, window_seconds: int = 86_400, **kwargs) -> list[dict[str, Any]]:
    """The groups a `sample` of `n` by `node` is answered with, as the node reads them: what the socket
    calls for the reply (pool.sampling.rollout_sample), each group's protocol JSON parsed."""
    from pool.sampling import rollout_sample

    return [json.loads(text) for text in rollout_sample(node=node, n=n, window_seconds=window_seconds, **kwargs).texts]
