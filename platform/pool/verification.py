"""Re-verifying a shared group: rebuild its entry from (dataset, catalogue config, seed, index) and
re-score every completion with the dataset's verifier (sapo_node.tasks, the rule nodes use too).

Pure: no database. The first reason that applies is the verdict (docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from pool.messages import RolloutIn
from sapo_node.tasks import Catalogue, TaskError, build_entry, rewards_match, score_completion

ACCEPTED = "accepted"
REJECTED = "rejected"


@dataclass(frozen=True)
class Verification:
    verdict: str  # ACCEPTED or REJECTED
    reason: str  # "" when accepted
    verified_rewards: tuple[float, ...] | None  # None when the entry cannot be rebuilt

    @property
    def accepted(self) -> bool:
        return self.verdict == ACCEPTED


def verify_rollout(rollout: RolloutIn, catalogue: Catalogue) -> Verification:
    spec = catalogue.get(rollout.dataset)
    if spec is None:
        return Verification(REJECTED, "unknown_task", None)
    try:
        entry = build_entry(spec, rollout.seed, rollout.index)
    except TaskError as exc:
        return Verification(REJECTED, exc.code if exc.code in ("bad_index", "unknown_task") else "bad_index", None)
    # Score against the rebuilt entry even when the group is forged, so the rejection inbox can show
    # what the completions were really worth.
    verified = tuple(score_completion(spec, rollout.seed, entry, c) for c in rollout.completions)
    expected_answer = entry["answer"]
    if expected_answer is not None and not isinstance(expected_answer, str):
        expected_answer = str(expected_answer)
    if rollout.question != entry["question"]:
        return Verification(REJECTED, "question_mismatch", verified)
    if rollout.answer != expected_answer:
        return Verification(REJECTED, "answer_mismatch", verified)
    if not all(rewards_match(c, v) for c, v in zip(rollout.rewards, verified, strict=True)):
        return Verification(REJECTED, "reward_mismatch", verified)
    return Verification(ACCEPTED, "", verified)


def has_variance(rewards: tuple[float, ...] | list[float] | None) -> bool:
    """A group whose rewards all agree has zero advantage under GRPO: it teaches nothing."""
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9
