"""A group: one question, its ground truth, and G completions with their rewards.

`Group` is what travels (the protocol's rollout object); `TrainGroup` is a group made ready for
the update with the receiving node's own tokenizer. Nothing here touches torch or the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from sapo_node.ids import uuid7
from sapo_node.tasks import MAX_INDEX, MAX_SEED, TaskRef

#: Bounds on what a node accepts from the pool (the server enforces its own, usually tighter).
MAX_COMPLETIONS = 64
MAX_TEXT_CHARS = 65_536


@dataclass
class Group:
    """One rollout group as shared in the swarm (docs/protocol.md, `share` and `samples`)."""

    id: str
    round: int
    task: TaskRef
    question: str
    #: The ground truth; None for tasks that have no single answer.
    answer: str | None
    completions: list[str]
    rewards: list[float]
    #: The author node's public name (set on groups sampled from the pool).
    node: str | None = None

    @classmethod
    def new(
        cls, *, round: int, task: TaskRef, question: str, answer: str, completions: list[str], rewards: list[float]
    ) -> Group:
        return cls(str(uuid7()), round, task, question, answer, list(completions), list(rewards))

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "round": self.round,
            "task": self.task.to_json(),
            "question": self.question,
            "answer": self.answer,
            "completions": list(self.completions),
            "rewards": [float(r) for r in self.rewards],
        }

    @classmethod
    def from_wire(cls, data: Any) -> Group:
        """Parse an untrusted rollout object; raises ValueError on anything malformed or out of bounds."""
        try:
            task = data["task"]
            group = cls(
                id=_text(data["id"], 64),
                round=int(data["round"]),
                task=TaskRef(_text(task["dataset"], 128), int(task["seed"]), int(task["index"])),
                question=_text(data["question"], MAX_TEXT_CHARS),
                answer=_text(data["answer"], MAX_TEXT_CHARS) if data["answer"] is not None else None,
                completions=[_text(c, MAX_TEXT_CHARS) for c in data["completions"]],
                rewards=[float(r) for r in data["rewards"]],
                node=_text(data["node"], 128) if data.get("node") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed rollout: {exc!r}") from exc
        if not (0 <= group.task.seed <= MAX_SEED and 0 <= group.task.index < MAX_INDEX):
            raise ValueError("malformed rollout: seed or index out of range")
        if not (1 <= len(group.completions) <= MAX_COMPLETIONS) or len(group.rewards) != len(group.completions):
            raise ValueError("malformed rollout: completions and rewards must have equal, bounded length")
        if not all(math.isfinite(r) for r in group.rewards):
            raise ValueError("malformed rollout: non-finite reward")
        return group


def _text(value: Any, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"expected a string of at most {limit} characters")
    return value


@dataclass
class TrainGroup:
    """A group tokenised by this node: prompt ids, completion ids (each ending in EOS when the
    completion ended), and rewards from this node's own verifier."""

    id: str
    source: Literal["local", "external"]
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    rewards: list[float]
    extra: dict[str, Any] = field(default_factory=dict)
    #: What the completions are judged against: None, the group's mean (GRPO's); a number, this
    #: node's own reward on the task (sapo_node.baseline, for external groups with `own`).
    baseline: float | None = None

    @property
    def informative(self) -> bool:
        """False when all rewards agree: the group's advantages are all zero and it teaches nothing."""
        return max(self.rewards) - min(self.rewards) > 1e-6
