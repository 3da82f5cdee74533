"""Which datasets a share may make the server build, and where, within the catalogue check's bounds
(docs/protocol.md, "Verification").

A group names its dataset's seed, and verification builds the reasoning-gym dataset of that seed
(sapo_node.datasets, cached). Most datasets cost microseconds to build, but a configuration can make
one costly for every seed: a count_primes of max_n 40 million builds a sieve of 305 MiB in about 3
CPU-seconds, and passes the catalogue check (swarms.catalogue: BUILD_CPU_SECONDS, MEMORY_BYTES). So:

- Each catalogue dataset is measured in a worker process with the check's bounds
  (sapo_node.entry_check), which reports its CPU and peak memory; the share that asked first pays the
  worker's CPU. Once per process, except that a measurement that ran out of time or failed (a worker
  starved past its wall clock, the kernel's OOM killer) is tried again after a backoff (RETRY_SECONDS, doubling up to
  RETRY_MAX_SECONDS), its dataset refused meanwhile. The built-in catalogues' datasets
  (sapo_node.tasks.CATALOGUES: reviewed, microseconds) are not measured.
- A cheap one (at most CHEAP_SECONDS of CPU and CHEAP_BYTES) is built for any seed, in the verifying
  thread, and cached.
- A costly one is built only for a seed the server issued to the sharing node (its challenge's task
  seed: a valid MAC, this node, not expired), at most one (dataset, seed) per share, and only in a
  worker process under the same bounds (pool.build_worker): it verifies the share's groups of that
  dataset and seed and is killed past 10 CPU-s, 30 s of wall clock or 512 MiB (its groups then get
  `build_refused`); the
  server's process keeps nothing of it. The share pays the worker's CPU (pool.ingest charges each
  share its own verification), so a node collecting challenges to make the server build runs out of
  its CPU budget. Any other group of a costly dataset gets `build_refused`, at no cost.

The measured bytes count each of a cheap dataset's seeds in the dataset cache
(datasets.dataset_bytes_set), which is bounded by bytes as well as by count (datasets.MAX_CACHED_BYTES).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings

from pool.build_worker import groups_verified
from pool.challenges import challenge_fault, challenge_read
from pool.records import RolloutIn
from pool.verification import REJECTED, Verification, verify_entry
from sapo_node.datasets import TaskSpec, dataset_bytes_set, dataset_cached
from sapo_node.entry_check import (
    BUILD_CPU_SECONDS,
    BUILD_WALL_SECONDS,
    BuildCost,
    BuildFailed,
    BuildTimeout,
    build_first_bounded,
    run_bounded,
)
from sapo_node.tasks import CATALOGUES, Catalogue
from sapo_node.verifiers import extract_answer, score_answers_in_sandbox
from sapo_node.verifiers.sandbox import MEMORY_BYTES

#: The verdict of a group whose dataset the server would not build for it.
BUILD_REFUSED = "build_refused"
#: A dataset is cheap to build when one build costs at most this much CPU and memory.
CHEAP_SECONDS = 0.05
CHEAP_BYTES = 16 * 1024 * 1024
#: Seconds before a dataset whose measurement ran out of time or failed is measured again; each
#: further failure doubles them, up to RETRY_MAX_SECONDS.
RETRY_SECONDS = 60.0
RETRY_MAX_SECONDS = 3600.0

_REVIEWED = frozenset(spec.key for catalogue in CATALOGUES.values() for spec in catalogue.tasks)
_costs: dict[str, BuildCost] = {}  # spec.key -> its measured cost
_retry: dict[str, tuple[float, float]] = {}  # spec.key -> (monotonic time of its next measurement, backoff)
# One worker at a time per process, measuring or building: each may take MEMORY_BYTES.
_worker_slot = threading.Lock()


def build_cost(spec: TaskSpec) -> BuildCost | None:
    """What one of `spec`'s datasets costs to build (measured in a worker bounded by the catalogue
    check's CPU time, wall clock and memory); None when it could not be built within them (measured again after a
    backoff)."""
    return _cost_charged(spec)[0]


def _cost_charged(spec: TaskSpec) -> tuple[BuildCost | None, float]:
    """build_cost, and the CPU seconds a measurement made for this call cost its worker (0.0 when the
    cost was known, or is being retried later)."""
    key = spec.key
    if key in _REVIEWED:
        return BuildCost(0.0, 0), 0.0
    if key in _costs:
        return _costs[key], 0.0
    if _retry.get(key, (0.0, 0.0))[0] > time.monotonic():
        return None, 0.0
    with _worker_slot:
        if key in _costs:
            return _costs[key], 0.0
        if _retry.get(key, (0.0, 0.0))[0] > time.monotonic():
            return None, 0.0
        try:
            cost = build_first_bounded(
                spec.dataset,
                dict(spec.config),
                cpu_seconds=BUILD_CPU_SECONDS,
                wall_seconds=BUILD_WALL_SECONDS,
                memory_bytes=MEMORY_BYTES,
            )
        except (BuildTimeout, BuildFailed) as exc:
            backoff = min(RETRY_MAX_SECONDS, 2 * _retry[key][1]) if key in _retry else RETRY_SECONDS
            _retry[key] = (time.monotonic() + backoff, backoff)
            return None, exc.cpu_seconds
        dataset_bytes_set(spec, cost.peak_bytes)
        _costs[key] = cost
        _retry.pop(key, None)
        return cost, cost.worker_seconds


def is_cheap(cost: BuildCost | None) -> bool:
    return cost is not None and cost.cpu_seconds <= CHEAP_SECONDS and cost.peak_bytes <= CHEAP_BYTES


class ShareBuilds:
    """One share's builds: which of its groups' datasets the server builds, and where (`verdict`, asked
    for each group in order, before it is verified). `cpu_seconds`: what its workers cost, measuring
    and building, which the share pays."""

    def __init__(
        self, node_id: int, catalogue: Catalogue, rollouts: Sequence[RolloutIn], now: float | None = None
    ) -> None:
        self.node_id = node_id
        self.catalogue = catalogue
        self.rollouts = rollouts
        self.now = time.time() if now is None else now
        self.cpu_seconds = 0.0
        self.costly: tuple[str, int] | None = None  # the one costly (dataset, seed) this share builds
        self._built: dict[int, Verification] = {}  # id() of its groups -> their verdicts from the worker

    def verdict(self, rollout: RolloutIn) -> Verification | None:
        """`rollout`'s verdict when its dataset is not to be built in this process: `build_refused`, or
        what the worker that built it for this share found. None: verify it here (pool.verification)."""
        spec = self.catalogue.get(rollout.dataset)
        if spec is None or dataset_cached(spec, rollout.seed):
            return None  # nothing to build: verification answers it (unknown_task) or looks it up
        cost, spent = _cost_charged(spec)
        self.cpu_seconds += spent
        if is_cheap(cost):
            return None
        if cost is None:
            return _refused()
        wanted = (spec.key, rollout.seed)
        if self.costly is None and self._issued(rollout):
            self.costly = wanted
            self._build(spec, rollout.seed)
        if self.costly == wanted:
            return self._built[id(rollout)]
        return _refused()

    def _build(self, spec: TaskSpec, seed: int) -> None:
        """Verify the share's groups of (spec, seed) in one bounded worker, which builds the dataset."""
        mine = [r for r in self.rollouts if r.dataset == spec.dataset and r.seed == seed]
        try:
            with _worker_slot:
                done = run_bounded(
                    groups_verified,
                    (spec, mine),
                    cpu_seconds=BUILD_CPU_SECONDS,
                    wall_seconds=BUILD_WALL_SECONDS,
                    memory_bytes=MEMORY_BYTES,
                )
        except (BuildTimeout, BuildFailed) as exc:
            self.cpu_seconds += exc.cpu_seconds
            self._built = {id(r): _refused() for r in mine}
            return
        self.cpu_seconds += done.worker_seconds
        for rollout, found in zip(mine, done.value, strict=True):
            self._built[id(rollout)] = found if isinstance(found, Verification) else _scored_here(spec, rollout, found)

    def _issued(self, rollout: RolloutIn) -> bool:
        """Whether the group's seed is the task seed of a challenge the server issued to this node."""
        if rollout.proof is None:
            return False
        challenge = challenge_read(rollout.proof.challenge)
        fault = challenge_fault(challenge, self.node_id, self.now, settings.SAPO_CHALLENGE_TTL_SECONDS)
        return not fault and challenge.seed == rollout.seed


def _refused() -> Verification:
    return Verification(REJECTED, BUILD_REFUSED, None)


def _scored_here(spec: TaskSpec, rollout: RolloutIn, entry: dict[str, Any]) -> Verification:
    """The verdict of a group the worker rebuilt whose answers the sandbox scores (its workers build the
    dataset, under their own bounds)."""

    def score(completions: list[str]) -> list[float]:
        return score_answers_in_sandbox(spec, rollout.seed, entry, [extract_answer(c) for c in completions])

    return verify_entry(rollout, entry, score)


def costs_forget() -> None:
    """Forget the measured costs and the measurements to try again (tests)."""
    _costs.clear()
    _retry.clear()
