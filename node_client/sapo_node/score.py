"""Step 3 of a round: score every completion with the dataset's own verifier (sapo_node.tasks)."""

from __future__ import annotations

from sapo_node.generate import Generated
from sapo_node.groups import Group
from sapo_node.sample import Question
from sapo_node.tasks import ScoringTimeout, TaskSpec, score_completions


def score_group(spec: TaskSpec, seed: int, entry: dict, completions: list[str]) -> list[float]:
    """The verifier's reward in [0, 1] for each completion (0 when it has no <answer> tags, and when
    its scorer ran out of time in the sandbox: the node's own text, so it is a wrong answer, not a
    reason to drop the group)."""
    try:
        return score_completions(spec, seed, entry, completions)
    except ScoringTimeout as exc:
        return exc.scores


def score_rollouts(round: int, questions: list[Question], generated: list[Generated]) -> list[tuple[Group, Generated]]:
    """One shareable Group per question, paired with the token ids it was generated as."""
    scored = []
    for question, gen in zip(questions, generated, strict=True):
        rewards = score_group(question.spec, question.ref.seed, question.entry, gen.texts)
        group = Group.new(
            round=round,
            task=question.ref,
            question=question.question,
            answer=question.answer,
            completions=gen.texts,
            rewards=rewards,
        )
        scored.append((group, gen))
    return scored
