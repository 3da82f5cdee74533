"""Step 1 of a round: draw B questions from the node's own question stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sapo_node.tasks import TaskError, TaskRef, TaskSpec, TaskStream, build_entry

#: Draws tried for one question: a few entries cannot be generated (decimal_arithmetic: about 1
#: index in 20,000 divides by zero), never many in a row.
MAX_DRAWS_PER_QUESTION = 16


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
    return [_build_question(stream, ref) for ref in stream.draw(n)]


def _build_question(stream: TaskStream, ref: TaskRef) -> Question:
    spec = stream.catalogue.get(ref.dataset)
    assert spec is not None  # the stream draws from its own catalogue
    for _ in range(MAX_DRAWS_PER_QUESTION):
        try:
            return Question(ref, spec, build_entry(spec, ref.seed, ref.index))
        except TaskError as exc:
            error = exc
            ref = stream.redraw(ref)  # the same dataset, another index: deterministic in the seed
    raise RuntimeError(f"{MAX_DRAWS_PER_QUESTION} draws of {spec.dataset} in a row could not be built: {error}")
