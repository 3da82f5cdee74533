"""Tasks: the catalogues of reasoning-gym datasets, rebuilding entries, and scoring completions.

This module is the one rule shared by the node client and the platform: both rebuild an entry from
(dataset, catalogue config, seed, index) and score a completion the same way, so a node's claimed
reward and the server's verified reward agree exactly for honest nodes. It imports reasoning-gym
only (no torch, no network, no Django).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sapo_node import proof, protocol
from sapo_node.datasets import MAX_INDEX, TaskSpec, build_lock, dataset_for
from sapo_node.verifiers import ScoringTimeout, extract_answer, score_answers

__all__ = ["MAX_INDEX", "TaskSpec", "dataset_for"]  # their home is sapo_node.datasets

#: Seeds a task may use: non-negative and below this bound (indices: MAX_INDEX).
MAX_SEED = 2**31 - 1

#: Two rewards agree when they differ by no more than this.
REWARD_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Catalogue:
    """The tasks a pool accepts, as sent in the server's `welcome`."""

    name: str
    tasks: tuple[TaskSpec, ...]
    #: Each task's share of a node's draws, in the order of `tasks`; empty: all alike. A swarm's
    #: catalogue sets them (the server's `welcome`); the named catalogues below leave them empty.
    weights: tuple[float, ...] = ()
    #: Datasets an earlier version of the swarm's catalogue had and this one does not: the server
    #: answers a group of one `task_withdrawn` rather than `unknown_task`. Never sent: a node's has none.
    withdrawn: frozenset[str] = frozenset()

    def get(self, dataset: str) -> TaskSpec | None:
        for spec in self.tasks:
            if spec.dataset == dataset:
                return spec
        return None

    @property
    def datasets(self) -> list[str]:
        return [spec.dataset for spec in self.tasks]

    def to_json(self) -> dict[str, Any]:
        tasks = [spec.to_json() for spec in self.tasks]
        for task, weight in zip(tasks, self.weights, strict=False):
            task["weight"] = weight
        return {"name": self.name, "tasks": tasks}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Catalogue:
        tasks = tuple(TaskSpec(t["dataset"], dict(t.get("config") or {})) for t in data["tasks"])
        if not tasks:
            raise ValueError("a catalogue needs at least one task")
        weights = tuple(float(t["weight"]) for t in data["tasks"] if "weight" in t)
        if weights and (len(weights) != len(tasks) or not all(w > 0 for w in weights)):
            weights = ()  # a weight missing or not positive: draw alike rather than guess
        return cls(name=str(data.get("name", "custom")), tasks=tasks, weights=weights)


# The nine specialties of the SAPO paper's demo, with its configurations (shared/SAPO.md).
SAPO_CATALOGUE = Catalogue(
    name="sapo",
    tasks=(
        TaskSpec("arc_1d", {"min_size": 10, "max_size": 30, "num_train": 3}),
        TaskSpec(
            "basic_arithmetic",
            {
                "min_terms": 2,
                "max_terms": 6,
                "min_digits": 1,
                "max_digits": 4,
                "operators": ["+", "-", "*", "/"],
                "allow_parentheses": True,
            },
        ),
        TaskSpec("base_conversion", {"min_base": 2, "max_base": 16, "min_value": 0, "max_value": 1000}),
        TaskSpec("bf", {"difficulty": 1}),
        TaskSpec("binary_matrix", {"min_n": 3, "max_n": 10, "p_zero": 0.25}),
        TaskSpec("calendar_arithmetic", {"year": 2023, "offset_upper_bound": 100, "leap_year_range": 200}),
        TaskSpec(
            "decimal_arithmetic",
            {"min_terms": 2, "max_terms": 6, "min_num_decimal_places": 1, "max_num_decimal_places": 3, "precision": 5},
        ),
        TaskSpec("fraction_simplification", {"min_value": 1, "max_value": 100, "min_factor": 2, "max_factor": 100}),
        TaskSpec(
            "propositional_logic",
            {
                "min_vars": 2,
                "max_vars": 4,
                "min_statements": 2,
                "max_statements": 4,
                "min_complexity": 1,
                "max_complexity": 3,
            },
        ),
    ),
)

# Easy configurations of the same kinds of task, which a model of a few million parameters partly
# solves after a short warm start (shared/SAPO.md, "Measured here"). The local demo and the tiny
# model's offline default use these; the full configurations are for real models.
EASY_CATALOGUE = Catalogue(
    name="easy",
    tasks=(
        TaskSpec("calendar_arithmetic", {"year": 2023, "tasks": ["is_leap_year"], "leap_year_range": 200}),
        TaskSpec(
            "basic_arithmetic",
            {
                "min_terms": 2,
                "max_terms": 2,
                "min_digits": 1,
                "max_digits": 1,
                "operators": ["+", "-"],
                "allow_parentheses": False,
                "allow_negation": False,
            },
        ),
        TaskSpec("base_conversion", {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 15}),
        TaskSpec(
            "fraction_simplification",
            {"min_value": 1, "max_value": 10, "min_factor": 2, "max_factor": 5, "styles": ["plain"]},
        ),
    ),
)

CATALOGUES: dict[str, Catalogue] = {c.name: c for c in (SAPO_CATALOGUE, EASY_CATALOGUE)}


class TaskError(ValueError):
    """A task that cannot be rebuilt: unknown dataset or out-of-range seed/index."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def build_entry(spec: TaskSpec, seed: int, index: int) -> dict[str, Any]:
    """Rebuild the reasoning-gym entry {question, answer, metadata} for (spec, seed, index).

    Deterministic: anyone holding the same arguments gets the same entry.
    """
    if not (0 <= seed <= MAX_SEED) or not (0 <= index < MAX_INDEX):
        raise TaskError("bad_index", f"seed must be in [0, {MAX_SEED}] and index in [0, {MAX_INDEX})")
    try:
        ds = dataset_for(spec, seed)
    except (KeyError, ValueError) as exc:  # unknown name, or a config reasoning-gym refuses
        raise TaskError("unknown_task", f"cannot build dataset {spec.dataset!r}: {exc}") from exc
    try:
        if spec.dataset == "bf":  # bf prints while generating an entry too
            with build_lock, contextlib.redirect_stdout(io.StringIO()):
                return ds[index]
        return ds[index]
    except Exception as exc:
        # A few entries cannot be generated (decimal_arithmetic: about 1 index in 20,000 divides by
        # zero). Nobody can have answered them: a task like any other out-of-range one, not a crash.
        raise TaskError("bad_index", f"{spec.dataset} cannot build index {index}: {exc!r}") from exc


#: Indices tried for one entry: a few cannot be generated (decimal_arithmetic: about 1 index in
#: 20,000 divides by zero), never many in a row.
MAX_DRAWS = 16


def build_first(spec: TaskSpec, seed: int, indices: Iterator[int]) -> tuple[int, dict[str, Any]]:
    """The first entry of `indices` that can be built, as (index, entry): the one way to turn drawn
    indices into entries (sampler, warm start, evaluation), so that none of them dies on an index
    reasoning-gym cannot generate. Consumes `indices` up to and including the index it returns, so
    callers that share one iterator get successive buildable entries; raises RuntimeError after
    MAX_DRAWS failures in a row (a spec that builds nothing is a configuration error)."""
    error: TaskError | None = None
    for _, index in zip(range(MAX_DRAWS), indices, strict=False):
        try:
            return index, build_entry(spec, seed, index)
        except TaskError as exc:
            if exc.code != "bad_index" or not 0 <= index < MAX_INDEX:
                raise
            error = exc
    raise RuntimeError(f"{MAX_DRAWS} indices of {spec.dataset} in a row could not be built: {error}")


def build_entries(spec: TaskSpec, seed: int, n: int, *, start: int = 0) -> list[dict[str, Any]]:
    """The first `n` buildable entries of (spec, seed) from index `start` on: held-out evaluation sets."""
    indices = itertools.count(start)
    return [build_first(spec, seed, indices)[1] for _ in range(n)]


def entries_at(spec: TaskSpec, seed: int, indices: list[int]) -> list[dict[str, Any]]:
    """The entries of drawn `indices`. One that reasoning-gym cannot build is replaced by the first
    buildable index of a sequence seeded by it, so the result depends on the draw alone (not on which
    process builds it, nor on other draws): the warm start builds batches in worker processes."""
    return [build_first(spec, seed, itertools.chain([i], random_indices(random.Random(i))))[1] for i in indices]


def entries_of(draw: tuple[TaskSpec, int, list[int]]) -> list[dict[str, Any]]:
    """entries_at of one (spec, seed, indices) draw: the function a worker process maps."""
    return entries_at(*draw)


def random_indices(rng: random.Random) -> Iterator[int]:
    """Indices drawn from `rng` for as long as they are asked for (build_first's redraws)."""
    while True:
        yield rng.randrange(MAX_INDEX)


def score_completions(
    spec: TaskSpec,
    seed: int,
    entry: dict[str, Any],
    completions: list[str],
    extract: Callable[[list[str]], list[str | None]] | None = None,
) -> list[float]:
    """The dataset verifier's score in [0, 1] of the answer in each completion: the text of its last
    <answer>...</answer> (0 without tags), scored within the budget of sapo_node.verifiers (length
    cap, bounded scorers, the sandbox for unreviewed ones). Raises ScoringTimeout (whose `scores` has
    0.0 for the answers that ran out of time) when the sandbox had to stop a scorer.

    `extract`: a twin of `extract_answer` over a list, the same answers for the same completions (the
    server passes its C one, sapo_native.answers); by default `extract_answer` per completion."""
    answers = extract(completions) if extract is not None else [extract_answer(c) for c in completions]
    return score_answers(spec, seed, entry, answers, dataset_for(spec, seed))


def score_completion(spec: TaskSpec, seed: int, entry: dict[str, Any], completion: str) -> float:
    """`score_completions` of one completion; an answer that runs out of time scores 0."""
    try:
        return score_completions(spec, seed, entry, [completion])[0]
    except ScoringTimeout as exc:
        return exc.scores[0]


def rewards_match(claimed: float, verified: float) -> bool:
    return abs(float(claimed) - float(verified)) <= REWARD_TOLERANCE


@dataclass(frozen=True)
class TaskRef:
    """The identity of one question: which dataset, and the (seed, index) that rebuilds it."""

    dataset: str
    seed: int
    index: int


class TaskStream:
    """A node's stream of questions: from the server's challenge when it holds one, else its own.

    Each draw picks a dataset from the catalogue (by its weights, if it has any, else uniformly). Its
    (seed, index) come from the newest challenge the node holds (`follow`): seed `proof.task_seed(c)`
    and the indices `proof.task_index(c, j)` for j = 0, 1, ... in order, so the server chose the
    questions and can check them (docs/protocol.md, "Proof of work"). Without a challenge (offline, in
    silo, before the first welcome), or once a challenge has too few questions left for a draw, the
    index is a fresh one from the node's own generator and the seed is the node's: two nodes with
    different seeds see different questions.

    `state` is the generator's (a checkpoint saves it); the challenge is not saved: it belongs to the
    connection, and a resumed node takes the one its next welcome brings.
    """

    def __init__(self, catalogue: Catalogue, seed: int) -> None:
        self.catalogue = catalogue
        self.seed = seed % (MAX_SEED + 1)
        if self.seed == protocol.HELDOUT_SEED:  # the server's held-out stream: no node trains on it
            self.seed += 1
        self._rng = random.Random(seed)
        #: The newest challenge taken (None: none yet), and its next question j.
        self.challenge: str | None = None
        self._next_j = 0

    def follow(self, challenge: str | None) -> None:
        """Take `challenge` if it is newer than the one held (a different one: the server sends each
        once, the newest last); its questions are drawn from j = 0."""
        if challenge is not None and challenge != self.challenge:
            self.challenge, self._next_j = challenge, 0

    def draw(self, n: int) -> list[TaskRef]:
        """The next `n` questions: the challenge's when it has `n` left, else the node's own."""
        under = self.challenge is not None and self._next_j + n <= proof.QUESTIONS_PER_CHALLENGE
        refs = []
        for _ in range(n):
            spec = self._pick()
            refs.append(self._next_challenge_ref(spec.dataset) if under else self._own_ref(spec.dataset))
        return refs

    def redraw(self, ref: TaskRef) -> TaskRef:
        """Another question of the same dataset, for a drawn one that cannot be built: the challenge's
        next question when `ref` is one of the challenge's and it has one left, else a fresh index from
        the node's own generator (deterministic in its seed)."""
        if self.challenge is not None and self.under_challenge(ref) and self._next_j < proof.QUESTIONS_PER_CHALLENGE:
            return self._next_challenge_ref(ref.dataset)
        return self._own_ref(ref.dataset)

    def under_challenge(self, ref: TaskRef) -> bool:
        """Whether `ref` is one of the held challenge's questions (the server's check of a proof)."""
        c = self.challenge
        return c is not None and ref.seed == proof.task_seed(c) and proof.question_number(c, ref.index) is not None

    def _pick(self) -> TaskSpec:
        if self.catalogue.weights:
            (spec,) = self._rng.choices(self.catalogue.tasks, weights=self.catalogue.weights)
            return spec
        return self._rng.choice(self.catalogue.tasks)

    def _next_challenge_ref(self, dataset: str) -> TaskRef:
        assert self.challenge is not None
        index = proof.task_index(self.challenge, self._next_j)
        self._next_j += 1
        return TaskRef(dataset, proof.task_seed(self.challenge), index)

    def _own_ref(self, dataset: str) -> TaskRef:
        return TaskRef(dataset, self.seed, self._rng.randrange(MAX_INDEX))

    def state(self) -> Any:
        return self._rng.getstate()

    def set_state(self, state: Any) -> None:
        self._rng.setstate(state)
