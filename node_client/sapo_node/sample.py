"""Step 1 of a round: draw B questions from the node's own question stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sapo_node.tasks import TaskRef, TaskSpec, TaskStream, build_entry


@dataclass
class Question:
    """A drawn question: its identity, the catalogue entry it comes from, and the rebuilt entry."""

    ref: TaskRef
    spec: TaskSpec
    entry: dict[str, Any]

    @property
    def question(self) -> str:
        return str(self.entry["question"])

    @property
    def answer(self) -> str | None:
        return entry_answer(self.entry)


def entry_answer(entry: dict[str, Any]) -> str | None:
    """The ground truth as shared: text, or None for tasks without a single answer (propositional_logic)."""
    answer = entry["answer"]
    return None if answer is None else str(answer)


def sample_questions(stream: TaskStream, n: int) -> list[Question]:
    """The next `n` questions of `stream`, each rebuilt with reasoning-gym (deterministic in the ref)."""
    questions = []
    for ref in stream.draw(n):
        spec = stream.catalogue.get(ref.dataset)
        assert spec is not None  # the stream draws from its own catalogue
        questions.append(Question(ref, spec, build_entry(spec, ref.seed, ref.index)))
    return questions
