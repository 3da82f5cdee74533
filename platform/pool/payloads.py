"""A `samples` reply's groups (docs/protocol.md, "samples"): one record per group drawn, and its JSON."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from common.compact_json import Raw, dumps, dumps_object
from pool.models import Rollout


class SampledGroup(NamedTuple):
    """A group drawn for a `samples` reply, as the reply carries it: from the draw's row
    (pool.sampling) or from a Rollout (its later rounds). `completions` and `rewards` are JSON text
    as PostgreSQL wrote the jsonb (the draw's raw cursor), or the values (a Rollout's)."""

    id: uuid.UUID
    node_id: int
    node_name: str
    round: int
    dataset: str
    seed: int
    index: int
    question: str
    answer: str | None
    completions: Any
    rewards: Any

    @classmethod
    def of_rollout(cls, rollout: Rollout) -> SampledGroup:
        """A Rollout with `node` loaded, as a sampled group."""
        r = rollout
        return cls(
            r.id,
            r.node_id,
            r.node.name,
            r.round,
            r.dataset,
            r.seed,
            r.index,
            r.question,
            r.answer,
            r.completions,
            r.verified_rewards,
        )


def sampled_group_json(group: SampledGroup) -> str:
    """The group's protocol object as JSON text: id, round, task, question, answer, completions,
    verified rewards and the author node's public name. A `sample` is answered often and its groups'
    completions are most of its bytes, so the jsonb columns are written as PostgreSQL wrote them,
    not parsed and dumped again (docs/benchmarks.md, "Sockets"); tests/platform/test_sampling.py
    compares the result with the object built field by field and encoded by json."""
    return dumps_object(
        {
            "id": str(group.id),
            "round": group.round,
            "task": {"dataset": group.dataset, "seed": group.seed, "index": group.index},
            "question": group.question,
            "answer": group.answer,
            "completions": _json_text(group.completions),
            "rewards": _json_text(group.rewards),
            "node": group.node_name,
        }
    )


def _json_text(value: Any) -> Raw:
    """A jsonb column's value as JSON text (psycopg hands Django's connections jsonb as text)."""
    return Raw(value if isinstance(value, str) else dumps(value))
