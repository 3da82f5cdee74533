"""A group: one question, its ground truth, and G completions with their rewards.

`Group` is what travels (the protocol's rollout object); `TrainGroup` is a group made ready for
the update with the receiving node's own tokenizer. Nothing here touches torch or the network.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from sapo_node import proof as proofs
from sapo_node.ids import uuid7
from sapo_node.protocol import SampledWireGroup, WireGroup, WireProof, WireTask
from sapo_node.tasks import MAX_INDEX, MAX_SEED, TaskRef

#: Bounds on what a node accepts from the pool (the server enforces its own, usually tighter).
MAX_COMPLETIONS = 64
MAX_TEXT_CHARS = 65_536
MAX_NAME_CHARS = 128  # a dataset's, a node's


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
    #: The proof of a group made under a server challenge (`make_proof`); None: unaudited.
    proof: WireProof | None = None

    @classmethod
    def new(
        cls, *, round: int, task: TaskRef, question: str, answer: str, completions: list[str], rewards: list[float]
    ) -> Group:
        return cls(str(uuid7()), round, task, question, answer, list(completions), list(rewards))

    def to_wire(self) -> dict[str, Any]:
        """The group's protocol object (sapo_node.protocol.WireGroup) as JSON-ready values."""
        task = self.task
        wire = WireGroup(
            id=uuid.UUID(self.id),
            round=self.round,
            task=WireTask(dataset=task.dataset, seed=task.seed, index=task.index),
            question=self.question,
            answer=self.answer,
            completions=self.completions,
            rewards=[float(r) for r in self.rewards],
            proof=self.proof,
        )
        return msgspec.to_builtins(wire)

    @classmethod
    def from_wire(cls, data: Any) -> Group:
        """Parse an untrusted rollout object (sapo_node.protocol.SampledWireGroup's fields, of its
        types); raises ValueError on anything malformed or out of bounds."""
        try:
            wire = msgspec.convert(data, SampledWireGroup)
        except msgspec.ValidationError as exc:
            raise ValueError(f"malformed rollout: {exc}") from exc
        task = wire.task
        if len(task.dataset) > MAX_NAME_CHARS or len(wire.node or "") > MAX_NAME_CHARS:
            raise ValueError(f"malformed rollout: dataset or node name over {MAX_NAME_CHARS} characters")
        if max(len(wire.question), len(wire.answer or ""), *map(len, wire.completions)) > MAX_TEXT_CHARS:
            raise ValueError(f"malformed rollout: a text over {MAX_TEXT_CHARS} characters")
        if not (0 <= task.seed <= MAX_SEED and 0 <= task.index < MAX_INDEX):
            raise ValueError("malformed rollout: seed or index out of range")
        if not (1 <= len(wire.completions) <= MAX_COMPLETIONS) or len(wire.rewards) != len(wire.completions):
            raise ValueError("malformed rollout: completions and rewards must have equal, bounded length")
        if not all(math.isfinite(r) for r in wire.rewards):
            raise ValueError("malformed rollout: non-finite reward")
        return cls(
            id=str(wire.id),
            round=wire.round,
            task=TaskRef(task.dataset, task.seed, task.index),
            question=wire.question,
            answer=wire.answer,
            completions=wire.completions,
            rewards=wire.rewards,
            node=wire.node,
            proof=wire.proof,
        )


def make_proof(
    *,
    challenge: str,
    weights: str,
    model: str,
    temperature: float,
    completion_ids: list[list[int]],
    logprobs: list[list[float]],
) -> WireProof:
    """The proof of a group generated under `challenge` by the weights committed as `weights`: each
    completion's sampled token ids (the stop included) and their log-probabilities, encoded as
    sapo_node.proof does (docs/protocol.md, "Proof of work")."""
    if len(completion_ids) != len(logprobs) or any(
        len(i) != len(p) for i, p in zip(completion_ids, logprobs, strict=True)
    ):
        raise ValueError("one log-probability per sampled token")
    return WireProof(
        challenge=challenge,
        weights=weights,
        model=model,
        temperature=float(temperature),
        tokens=[proofs.encode_ids(ids) for ids in completion_ids],
        logprobs=[proofs.encode_floats(lps) for lps in logprobs],
    )


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
