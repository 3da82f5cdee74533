"""Shared helpers for the pool tests (no tests here): real groups built with sapo_node.tasks."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from pool.ingest_statement import SwarmOfBatch
from pool.limits import Limits
from pool.records import RolloutIn
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


def proof_of(group: dict[str, Any], challenge: str, *, weights: str = "ab" * 32, tokens: int = 5) -> dict[str, Any]:
    """A well-formed proof (sapo_node.protocol.WireProof) for `group` under `challenge`: `tokens` token
    ids and log-probabilities per completion (their values are the audit's business, not the pool's)."""
    from sapo_node import proof

    count = len(group["completions"])
    return {
        "challenge": challenge,
        "weights": weights,
        "model": "tiny-mini",
        "temperature": 1.0,
        "tokens": [proof.encode_ids([k + t for t in range(tokens)]) for k in range(count)],
        "logprobs": [proof.encode_floats([-0.25] * tokens) for _ in range(count)],
    }


def challenged_group(challenge: str, j: int = 0, **kwargs: Any) -> dict[str, Any]:
    """An honest group answering question j of `challenge` (its seed and index), with its proof."""
    from sapo_node import proof

    group = make_group(seed=proof.task_seed(challenge), index=proof.task_index(challenge, j), **kwargs)
    group["proof"] = proof_of(group, challenge)
    return group


def share_frame(*groups: dict[str, Any], ref: str | None = None) -> dict[str, Any]:
    frame = {"type": "share", "v": 1, "rollouts": list(groups)}
    if ref:
        frame["ref"] = ref
    return frame


DEFAULT_LIMITS = Limits()


def sampled(node, n: int, *, window_seconds: int = 86_400, **kwargs) -> list[dict[str, Any]]:
    """The groups a `sample` of `n` by `node` is answered with, as the node reads them: what the socket
    calls for the reply (pool.sampling.rollout_sample), each group's protocol JSON parsed; in the
    site's default swarm unless `swarm_id` is given."""
    from pool.sampling import rollout_sample

    kwargs.setdefault("swarm_id", default_swarm().swarm_id)
    return [json.loads(text) for text in rollout_sample(node=node, n=n, window_seconds=window_seconds, **kwargs).texts]


def default_swarm() -> SwarmOfBatch:
    """The site's default swarm and its current catalogue version: where a socket whose hello names no
    swarm shares (the pool itself always takes the swarm from its caller)."""
    from swarms.services import swarm_default_ensure

    swarm = swarm_default_ensure()
    return SwarmOfBatch(swarm.id, swarm.catalogue_version)


def uuid7_time(value: uuid.UUID) -> datetime:
    """The time a UUIDv7 was made at (its first 48 bits), in UTC: what a test reads back from an id
    sapo_node.ids made (the product only compares ids, uuid7_floor)."""
    return datetime.fromtimestamp((value.int >> 80) / 1000, tz=UTC)
