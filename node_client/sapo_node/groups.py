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
    #: Per completion, the sharer's log-probability of each of `completion_ids`' tokens under its
    #: sampling (an external group whose proof matches this node's tokens: `sharer_logprobs`); None
    #: for own groups and external groups trained uncorrected.
    sharer_logprobs: list[list[float]] | None = None

    @property
    def informative(self) -> bool:
        """False when all rewards agree: the group's advantages are all zero and it teaches nothing."""
        return max(self.rewards) - min(self.rewards) > 1e-6


@dataclass(frozen=True)
class ExternalRules:
    """How a node takes external groups beyond verifying them (NodeConfig's correction, success_gate and
    learning_zone options; docs/node.md, "Corrected and gated sharing"). The defaults change nothing."""

    #: This node's model name: a proof naming another model was sampled with another tokenizer.
    model: str = ""
    #: Read the sharer's log-probabilities (the correction or the off-policy filter is on).
    use_logprobs: bool = False
    #: An external group whose log-probabilities do not apply: uncorrected (trained as it is) or skip.
    mismatch: str = "uncorrected"
    #: Keep only external groups with at least one verified-correct completion.
    success_gate: bool = False
    #: External groups whose reward mean lies in [low, high] are chosen first.
    zone: tuple[float, float] = (0.0, 1.0)


#: The rules of a node with every external option off: external groups as the paper takes them.
PLAIN_RULES = ExternalRules()

#: A reward at least this high is a verified-correct completion (reasoning-gym scores a right answer 1.0).
CORRECT_REWARD = 1.0 - 1e-6


def has_success(rewards: list[float]) -> bool:
    """Whether a group holds at least one verified-correct completion (success-gated sampling)."""
    return max(rewards) >= CORRECT_REWARD


def in_learning_zone(rewards: list[float], low: float, high: float) -> bool:
    """Whether a group's reward mean lies inside [low, high] (the learning-zone preference)."""
    return low <= sum(rewards) / len(rewards) <= high


def sharer_logprobs(
    group: Group, completion_ids: list[list[int]], *, model: str
) -> tuple[list[list[float]] | None, str]:
    """The sharer's per-token log-probabilities of this node's tokens of each completion, or None and why not.

    The sharer's log-probabilities apply to this node's tokens only when they are the same tokens in the
    same context: the proof names this node's model (so the same tokenizer and prompt format), was
    sampled (temperature > 0: a greedy proof logs no sampling distribution), and each completion's ids
    as this node tokenised its text are a prefix of the ids the sharer sampled (its stop token, or a cut
    at this node's max tokens, may follow). The proof is untrusted: it is decoded and held to one
    finite, non-positive log-probability per token. Reasons: no_proof, other_model, greedy, malformed,
    tokens_differ."""
    wire = group.proof
    if wire is None:
        return None, "no_proof"
    if wire.model != model:
        return None, "other_model"
    if not wire.temperature > 0:
        return None, "greedy"
    if not (len(wire.tokens) == len(wire.logprobs) == len(completion_ids)):
        return None, "malformed"
    aligned = []
    for ids, encoded_ids, encoded_lps in zip(completion_ids, wire.tokens, wire.logprobs, strict=True):
        try:
            sampled, lps = proofs.decode_ids(encoded_ids), proofs.decode_floats(encoded_lps)
        except ValueError:
            return None, "malformed"
        if len(sampled) != len(lps) or not all(math.isfinite(x) and x <= 0.0 for x in lps):
            return None, "malformed"
        if sampled[: len(ids)] != ids:
            return None, "tokens_differ"
        aligned.append(lps[: len(ids)])
    return aligned, ""
