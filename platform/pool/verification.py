"""Re-verifying a shared group: rebuild its entry from (dataset, catalogue config, seed, index) and
re-score every completion with the dataset's verifier (sapo_node.tasks, the rule nodes use too).

Pure: no database. The first reason that applies is the verdict (docs/protocol.md). The cheap checks
come first: a group whose question or answer is not the one its task rebuilds is rejected without
scoring any completion (its verified rewards are None, shown as "not scored" in the inbox), so
forged groups cost no scoring CPU however hostile their completions. Scoring itself is bounded per
answer (sapo_node.verifiers: length caps, bounded scorers, a sandbox with a clock for the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from common.native import native
from pool.records import RolloutIn
from sapo_node import protocol
from sapo_node.tasks import (
    Catalogue,
    ScoringTimeout,
    TaskError,
    TaskSpec,
    build_entry,
    rewards_match,
    score_completions,
)

ACCEPTED = "accepted"
REJECTED = "rejected"
#: The reason of a group of the held-out stream's seed, which no node may train on (sockets.heldout).
HELDOUT_SEED = "heldout_seed"


class Verification(msgspec.Struct, frozen=True):
    """A group's verdict (a msgspec Struct: one is built per group of every share, faster than a frozen
    dataclass)."""

    verdict: str  # ACCEPTED or REJECTED
    reason: str  # "" when accepted
    verified_rewards: tuple[float, ...] | None  # None: not scored (no entry rebuilt, question or answer forged)

    @property
    def accepted(self) -> bool:
        return self.verdict == ACCEPTED


def verify_rollout(rollout: RolloutIn, catalogue: Catalogue) -> Verification:
    spec = catalogue.get(rollout.dataset)
    if spec is None:
        reason = "task_withdrawn" if rollout.dataset in catalogue.withdrawn else "unknown_task"
        return Verification(REJECTED, reason, None)
    if rollout.seed == protocol.HELDOUT_SEED:  # shared, it would be trained on: refused unbuilt
        return Verification(REJECTED, HELDOUT_SEED, None)
    entry = entry_rebuilt(spec, rollout)
    if isinstance(entry, Verification):
        return entry
    fast = native()  # the answers taken in C (sapo_native.answers), else per completion in Python
    extract = fast.answers if fast is not None else None
    return verify_entry(
        rollout, entry, lambda completions: score_completions(spec, rollout.seed, entry, completions, extract)
    )


def entry_rebuilt(spec: TaskSpec, rollout: RolloutIn) -> dict[str, Any] | Verification:
    """The entry `rollout` names, rebuilt (its dataset built, or taken from the cache), or the verdict
    of a task that cannot be rebuilt."""
    try:
        return build_entry(spec, rollout.seed, rollout.index)
    except TaskError as exc:
        return Verification(REJECTED, exc.code if exc.code in ("bad_index", "unknown_task") else "bad_index", None)


def verify_entry(rollout: RolloutIn, entry: dict[str, Any], score: Callable[[list[str]], list[float]]) -> Verification:
    """`rollout`'s verdict against its rebuilt `entry`, its completions scored by `score` (which may
    raise ScoringTimeout): the question and answer first, so a forged group costs no scoring."""
    expected_answer = entry["answer"]
    if expected_answer is not None and not isinstance(expected_answer, str):
        expected_answer = str(expected_answer)
    if rollout.question != entry["question"]:
        return Verification(REJECTED, "question_mismatch", None)
    if rollout.answer != expected_answer:
        return Verification(REJECTED, "answer_mismatch", None)
    try:
        verified = tuple(score(list(rollout.completions)))
    except ScoringTimeout as exc:
        # Only a scorer outside the reviewed catalogue runs in the sandbox; what ran out of time is
        # stored as 0.0, and the group is rejected for it rather than judged on a guess.
        return Verification(REJECTED, exc.code, tuple(exc.scores))
    # Equal tuples first (an honest node's rewards are the scores exactly: one comparison in C).
    if rollout.rewards != verified and not all(
        rewards_match(c, v) for c, v in zip(rollout.rewards, verified, strict=True)
    ):
        return Verification(REJECTED, "reward_mismatch", verified)
    return Verification(ACCEPTED, "", verified)


def has_variance(rewards: tuple[float, ...] | list[float] | None) -> bool:
    """A group whose rewards all agree has zero advantage under GRPO: it teaches nothing."""
    return bool(rewards) and max(rewards) - min(rewards) > 1e-9
