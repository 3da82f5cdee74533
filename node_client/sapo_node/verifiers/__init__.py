"""Scoring answers from strangers: every score bounded, no answer ever run as code.

Every completion a node shares is text from a stranger, scored by the server and by every node that
samples it. The budget of one answer (docs/protocol.md, "Verification"):

1. The answer is taken in linear time (answers.py), and an answer longer than its dataset's
   `max_answer_chars` (vetted.py) scores 0 without being parsed.
2. Catalogue datasets are scored in this process by code that is bounded by construction: our own
   parsers where reasoning-gym's evaluates the answer or is super-linear (matrix.py, logic.py), and
   reasoning-gym's own scorer where it was reviewed to be linear and free of eval (vetted.py, pinned
   by source hash).
3. Anything else (a dataset not reviewed, or reviewed code that changed) is scored in worker
   processes under a wall-clock limit per answer, RLIMIT_CPU, RLIMIT_AS and an audit hook that
   refuses eval/exec/compile (sandbox.py). An answer that runs out of time makes the score raise
   ScoringTimeout.

Why the catalogue's scorers stay in process rather than all going through the workers: the honest
path must keep up with ingest, and through the workers scoring costs ten times more per completion
than in process, below ingest's rate (bench/attack.py; docs/benchmarks.md, "Attacks on verification").
The in-process scorers do not need the workers' clock: they are bounded by construction, and their
worst answer at the length cap costs well under a millisecond (measured there too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sapo_node.verifiers.answers import extract_answer
from sapo_node.verifiers.vetted import VERIFIERS, delegate_in_process, max_answer_chars

__all__ = [
    "ScoringTimeout",
    "extract_answer",
    "max_answer_chars",
    "score_answers",
    "score_answers_in_sandbox",
    "scored_in_process",
]

#: The verdict reason of a group with an answer that ran out of time (docs/protocol.md).
TIMEOUT_REASON = "verification_timeout"


class ScoringTimeout(Exception):
    """Some answers ran out of time in the sandbox. `scores` holds every answer's score, 0.0 for
    those; `timed_out` their positions."""

    code = TIMEOUT_REASON

    def __init__(self, scores: list[float], timed_out: list[int]) -> None:
        super().__init__(f"{len(timed_out)} answer(s) ran out of time")
        self.scores = scores
        self.timed_out = timed_out


def _clamp(score: Any) -> float:
    score = float(score)
    return min(1.0, max(0.0, score)) if score == score else 0.0  # NaN scores 0


def score_answers(
    spec: Any, seed: int, entry: dict[str, Any], answers: Sequence[str | None], instance: Any
) -> list[float]:
    """The score in [0, 1] of each answer (None: the completion had no answer tags, score 0) for the
    entry of `spec` (a TaskSpec) built with `seed`; `instance` is its reasoning-gym dataset.

    Raises ScoringTimeout when the sandbox stopped a scorer."""
    unique = _unique(spec, answers)
    if not unique:
        return [0.0] * len(answers)
    verifier = VERIFIERS.get(spec.dataset)
    if verifier is not None and verifier.own is not None:
        scorer = verifier.own
    elif delegate_in_process(spec.dataset, instance):
        scorer = instance.score_answer
    else:
        return _score_in_sandbox(spec, seed, entry, answers, unique)
    scored = {}
    for answer in unique:
        try:
            scored[answer] = _clamp(scorer(answer, entry))
        except Exception:  # a verifier choking on hostile text is a wrong answer, not a crash
            scored[answer] = 0.0
    return [scored.get(a, 0.0) if a is not None else 0.0 for a in answers]


def scored_in_process(dataset: str, instance: Any) -> bool:
    """Whether `score_answers` scores `dataset`'s answers in this process (else in the sandbox's
    workers, which build the dataset themselves); `instance` is its reasoning-gym dataset."""
    verifier = VERIFIERS.get(dataset)
    return (verifier is not None and verifier.own is not None) or delegate_in_process(dataset, instance)


def score_answers_in_sandbox(spec: Any, seed: int, entry: dict[str, Any], answers: Sequence[str | None]) -> list[float]:
    """`score_answers` of a dataset not `scored_in_process`, without its dataset in this process: the
    sandbox's workers build it (within their time and memory bounds). Raises ScoringTimeout as
    score_answers does."""
    unique = _unique(spec, answers)
    return _score_in_sandbox(spec, seed, entry, answers, unique) if unique else [0.0] * len(answers)


def _unique(spec: Any, answers: Sequence[str | None]) -> list[str]:
    # Each distinct answer is scored once: a group's completions often end in the same answer ("42"
    # eight times), and a scorer's result depends only on the answer and the entry.
    cap = max_answer_chars(spec.dataset)
    return list(dict.fromkeys(a for a in answers if a is not None and len(a) <= cap))


def _score_in_sandbox(
    spec: Any, seed: int, entry: dict[str, Any], answers: Sequence[str | None], unique: list[str]
) -> list[float]:
    from sapo_node.verifiers.sandbox import sandbox

    results = dict(zip(unique, sandbox().score(spec.dataset, dict(spec.config), seed, entry, unique), strict=True))
    scores = [0.0] * len(answers)
    timed_out = []
    for i, answer in enumerate(answers):
        result = results.get(answer, 0.0) if answer is not None else 0.0
        if result is None:
            timed_out.append(i)
        else:
            scores[i] = result
    if timed_out:
        raise ScoringTimeout(scores, timed_out)
    return scores
