"""Which datasets a share may make the server build, within the catalogue check's bounds
(docs/protocol.md, "Verification").

A group names its dataset's seed, and verification builds the reasoning-gym dataset of that seed
(sapo_node.datasets, cached). Most datasets cost microseconds to build, but a configuration can make
one costly for every seed: a count_primes of max_n 40 million builds a sieve of 305 MiB in about 3
CPU-seconds, and passes the catalogue check (swarms.catalogue: BUILD_SECONDS, MEMORY_BYTES). So:

- Each catalogue dataset is measured once per process: built, with its first entry, in a worker
  process with the check's bounds (sapo_node.entry_check), which reports its CPU and peak memory. The
  built-in catalogues' datasets (sapo_node.tasks.CATALOGUES: reviewed, microseconds) are not.
- A cheap one (at most CHEAP_SECONDS of CPU and CHEAP_BYTES) is built for any seed, in the verifying
  thread, as before.
- A costly one is built only for a seed the server issued to the sharing node (its challenge's task
  seed: a valid MAC, this node, not expired), at most one (dataset, seed) per share; any other group
  of it whose dataset is not cached gets the verdict `build_refused`, at no cost. A node naming fresh
  seeds of it gets nothing built, and one collecting challenges gets one build per frame, charged to
  its CPU budget (pool.ingest charges each share its own verification).
- One the worker could not build within the bounds gets `build_refused` for every group.

The measured bytes count each of the dataset's seeds in the dataset cache (datasets.dataset_bytes_set),
which is bounded by bytes as well as by count (datasets.MAX_CACHED_BYTES).
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

from pool.challenges import challenge_fault, challenge_read
from pool.messages import RolloutIn
from sapo_node.datasets import TaskSpec, dataset_bytes_set, dataset_cached
from sapo_node.entry_check import BuildCost, BuildTimeout, build_first_bounded
from sapo_node.tasks import CATALOGUES, Catalogue
from sapo_node.verifiers.sandbox import BUILD_SECONDS, MEMORY_BYTES

#: The verdict of a group whose dataset the server would not build for it.
BUILD_REFUSED = "build_refused"
#: A dataset is cheap to build when one build costs at most this much CPU and memory.
CHEAP_SECONDS = 0.05
CHEAP_BYTES = 16 * 1024 * 1024

_REVIEWED = frozenset(spec.key for catalogue in CATALOGUES.values() for spec in catalogue.tasks)
_costs: dict[str, BuildCost | None] = {}  # spec.key -> its measured cost; None: not buildable in the bounds
_measuring = threading.Lock()  # one measurement at a time per process: each is a worker of MEMORY_BYTES


def build_cost(spec: TaskSpec) -> BuildCost | None:
    """What one of `spec`'s datasets costs to build (measured once per process, in a worker bounded by
    the catalogue check's time and memory); None when it cannot be built within them."""
    key = spec.key
    if key in _REVIEWED:
        return BuildCost(0.0, 0)
    if key in _costs:
        return _costs[key]
    with _measuring:
        if key not in _costs:
            try:
                cost: BuildCost | None = build_first_bounded(
                    spec.dataset, dict(spec.config), seconds=BUILD_SECONDS, memory_bytes=MEMORY_BYTES
                )
            except (BuildTimeout, RuntimeError):
                cost = None
            if cost is not None:
                dataset_bytes_set(spec, cost.peak_bytes)
            _costs[key] = cost
    return _costs[key]


def is_cheap(cost: BuildCost | None) -> bool:
    return cost is not None and cost.cpu_seconds <= CHEAP_SECONDS and cost.peak_bytes <= CHEAP_BYTES


class ShareBuilds:
    """One share's builds: which of its groups' datasets the server builds (`refusal`, asked for each
    group in order, before it is verified)."""

    def __init__(self, node_id: int, catalogue: Catalogue, now: float | None = None) -> None:
        self.node_id = node_id
        self.catalogue = catalogue
        self.now = time.time() if now is None else now
        self.costly: tuple[str, int] | None = None  # the one costly (dataset, seed) this share builds

    def refusal(self, rollout: RolloutIn) -> str:
        """BUILD_REFUSED when verifying `rollout` would build a dataset this share may not build, else ""."""
        spec = self.catalogue.get(rollout.dataset)
        if spec is None or dataset_cached(spec, rollout.seed):
            return ""  # nothing to build: verification answers it (unknown_task) or looks it up
        cost = build_cost(spec)
        if is_cheap(cost):
            return ""
        if cost is None:
            return BUILD_REFUSED
        wanted = (spec.key, rollout.seed)
        if self.costly == wanted:
            return ""  # the same dataset again (cached by the first group, within the cache's bounds)
        if self.costly is None and self._issued(rollout):
            self.costly = wanted
            return ""
        return BUILD_REFUSED

    def _issued(self, rollout: RolloutIn) -> bool:
        """Whether the group's seed is the task seed of a challenge the server issued to this node."""
        if rollout.proof is None:
            return False
        challenge = challenge_read(rollout.proof.challenge)
        fault = challenge_fault(challenge, self.node_id, self.now, settings.SAPO_CHALLENGE_TTL_SECONDS)
        return not fault and challenge.seed == rollout.seed


def costs_forget() -> None:
    """Forget the measured costs (tests)."""
    _costs.clear()
