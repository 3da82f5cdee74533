"""A catalogue entry's dataset (TaskSpec) and the reasoning-gym datasets built from it, cached.

Below both sapo_node.tasks and sapo_node.verifiers (the sandbox's workers build datasets too), so
neither has to import the other back. Imports reasoning-gym only.
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import reasoning_gym

#: Indices a task may use: non-negative and below this bound.
MAX_INDEX = 10**9


@dataclass(frozen=True)
class TaskSpec:
    """One dataset of a catalogue: a reasoning-gym name and the keyword config it is built with."""

    dataset: str
    config: dict[str, Any] = field(default_factory=dict, hash=False)

    @cached_property
    def key(self) -> str:
        """A stable text form of (dataset, config), used to cache built datasets (computed once:
        verification asks for it for every completion)."""
        return self.dataset + ":" + json.dumps(self.config, sort_keys=True)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "config": dict(self.config)}


# Building a bf entry prints dots to stdout; redirect_stdout swaps the process-wide sys.stdout,
# so builds are serialised rather than letting one thread swallow another's output.
build_lock = threading.Lock()
# Built datasets by (dataset, config, seed). Verification scores every completion of every group,
# so a hit must cost a dict lookup: no lock, no re-serialised config.
_datasets: dict[tuple[str, int], Any] = {}
#: Built datasets kept at most, by count and by their bytes together, each counted at its spec's
#: measured size (`dataset_bytes_set`: the server measures a catalogue's unreviewed datasets in a
#: worker, pool.builds) or DEFAULT_DATASET_BYTES. Oldest first out: a dataset is a function of its
#: seed, rebuilt when asked for again.
MAX_CACHED_DATASETS = 1024
MAX_CACHED_BYTES = 512 * 1024 * 1024  # the catalogue check's memory bound: a dataset it let through fits
#: What a dataset nobody measured is counted at: reasoning-gym's datasets keep their config and a few
#: small tables (a count_primes of max_n 40 million keeps its sieve, 305 MiB: measured, not assumed).
DEFAULT_DATASET_BYTES = 64 * 1024
_held: dict[tuple[str, int], int] = {}  # the bytes each cached dataset is counted at
_sizes: dict[str, int] = {}  # spec.key -> measured bytes of one of its datasets
_cached_bytes = 0


def dataset_bytes_set(spec: TaskSpec, size: int) -> None:
    """Count `spec`'s datasets at `size` bytes each in the cache (what building one was measured to hold)."""
    _sizes[spec.key] = max(0, int(size))


def dataset_cached(spec: TaskSpec, seed: int) -> bool:
    """Whether `dataset_for(spec, seed)` is a lookup, not a build."""
    return (spec.key, seed) in _datasets


def cached_bytes() -> int:
    """The bytes the cached datasets are counted at."""
    return _cached_bytes


def _keep(key: tuple[str, int], ds: Any, size: int) -> None:
    """Cache `ds`, first dropping the oldest until it fits (caller holds build_lock)."""
    global _cached_bytes
    if size > MAX_CACHED_BYTES:
        return  # rebuilt at each use: the bound holds for the datasets kept, whatever one costs
    while _datasets and (len(_datasets) >= MAX_CACHED_DATASETS or _cached_bytes + size > MAX_CACHED_BYTES):
        oldest = next(iter(_datasets))
        del _datasets[oldest]
        _cached_bytes -= _held.pop(oldest, 0)
    _datasets[key] = ds
    _held[key] = size
    _cached_bytes += size


def dataset_for(spec: TaskSpec, seed: int) -> Any:
    """The reasoning-gym dataset of `spec` with `seed` (built once, then cached within the bounds above)."""
    key = (spec.key, seed)
    ds = _datasets.get(key)
    if ds is not None:
        return ds
    config = dict(spec.config)
    for name in ("operators", "styles"):  # reasoning-gym takes tuples where JSON has lists
        if isinstance(config.get(name), list):
            config[name] = tuple(config[name])
    with build_lock:
        ds = _datasets.get(key)
        if ds is None:
            with contextlib.redirect_stdout(io.StringIO()):
                ds = reasoning_gym.create_dataset(spec.dataset, size=MAX_INDEX, seed=seed, **config)
            _keep(key, ds, _sizes.get(spec.key, DEFAULT_DATASET_BYTES))
    return ds


def datasets_forget() -> None:
    """Drop every cached dataset (tests)."""
    global _cached_bytes
    with build_lock:
        _datasets.clear()
        _held.clear()
        _cached_bytes = 0
