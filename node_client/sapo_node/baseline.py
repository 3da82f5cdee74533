"""What an external group's completions are judged against: the group's own mean, or this node's.

GRPO's advantage (r - mean) / std is measured *within* a group. For a node's own groups that is
the point: of what this node just did, push up the better completions, push down the worse. For a
group another node generated it asks a different question: of what *the sender* did, which
completions were better than the sender's average. The advantages sum to zero, so whatever all of
the sender's completions share (the form of an answer: "Yes"/"No" for a leap year, a fraction
rather than a number) is pushed up by the good ones exactly as much as it is pushed down by the bad
ones. A receiver that has never produced that form learns which answer of that form is right, not
to produce it: the skill that one node's "aha moment" should spread does not travel.

`own` (NodeConfig.external_baseline) judges an external completion against what *this* node
achieves on that task: the advantage is (r - b) / std, where b is a moving average of this node's
own mean reward on the dataset (the group's std, clamped to +-MAX_ADVANTAGE). A peer's correct
answer to a task this node fails at (b ~ 0) is pushed up whole, form and content; a peer's wrong
answer to a task this node masters (b ~ 1) is pushed down. Own groups keep the group mean. A
dataset this node has not yet answered itself has no baseline, and its external groups keep the
group mean too. Everything here is measured on this node; nothing is sent or trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sapo_node.groups import Group

BASELINES = ("group", "own")

#: Bound on |advantage| of a completion judged against the node's own baseline. Within a group of G
#: the group mean keeps |A| <= (G - 1) / sqrt(G) (2.5 for G = 8); a baseline from outside the group
#: has no such bound when the group's rewards barely differ.
MAX_ADVANTAGE = 3.0


@dataclass
class OwnBaseline:
    """Per dataset, a moving average of this node's own mean reward per question."""

    #: Weight of the newest round's mean in the moving average.
    decay: float = 0.2
    means: dict[str, float] = field(default_factory=dict)

    def observe(self, own: Iterable[Group]) -> None:
        """Fold in one round of this node's own groups (all of them: informative or not)."""
        per_dataset: dict[str, list[float]] = {}
        for group in own:
            if group.rewards:
                per_dataset.setdefault(group.task.dataset, []).append(sum(group.rewards) / len(group.rewards))
        for dataset, values in per_dataset.items():
            new = sum(values) / len(values)
            old = self.means.get(dataset)
            self.means[dataset] = new if old is None else (1 - self.decay) * old + self.decay * new

    def get(self, dataset: str) -> float | None:
        return self.means.get(dataset)
