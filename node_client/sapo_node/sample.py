"""Step 1 of a round: draw B questions from the node's own question stream."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sapo_node.tasks import TaskRef, TaskSpec, TaskStream, build_first


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
    # The drawn index, then the stream's redraws (deterministic in its seed), asked for only when needed.
    redraws: Iterator[int] = (stream.redraw(ref).index for _ in itertools.count())
    index, entry = build_first(spec, ref.seed, itertools.chain([ref.index], redraws))
    return Question(TaskRef(ref.dataset, ref.seed, index), spec, entry)
