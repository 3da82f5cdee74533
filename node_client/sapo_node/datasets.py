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
_MAX_CACHED_DATASETS = 1024


def dataset_for(spec: TaskSpec, seed: int) -> Any:
    """The reasoning-gym dataset of `spec` with `seed` (built once, then cached)."""
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
            if len(_datasets) >= _MAX_CACHED_DATASETS:
                _datasets.clear()  # many seeds: rebuilding is cheap (microseconds), memory is not
            _datasets[key] = ds
    return ds
