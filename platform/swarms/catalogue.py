"""A swarm's catalogue: its entries checked before they are stored, and the catalogue a node is sent.

An entry is {"dataset", "config", "weight"}. The check builds one entry of each dataset with
reasoning-gym, as verification will, so a configuration reasoning-gym refuses is refused here with
the field named, never at a node's first share; so is one it takes more than BUILD_CPU_SECONDS of CPU
to build with (in a worker process, killed then).
"""

from __future__ import annotations

import json
import math
import time
from functools import lru_cache
from typing import Any

from common.errors import ApplicationError
from sapo_node.datasets import TaskSpec
from sapo_node.entry_check import BUILD_CPU_SECONDS, BUILD_WALL_SECONDS, BuildTimeout, build_first_bounded
from sapo_node.tasks import Catalogue

MAX_ENTRIES = 32
MAX_CONFIG_BYTES = 4096
MAX_WEIGHT = 1000.0
#: Wall-clock seconds building all of a catalogue's entries may take. A configuration can make
#: reasoning-gym build for ever (a chain_sum of millions of terms), so each entry is built in a worker
#: process that is killed past BUILD_CPU_SECONDS of CPU, BUILD_WALL_SECONDS, or the catalogue's time
#: left (sapo_node.entry_check): the bounds the server builds a dataset under (pool.builds).
CHECK_SECONDS = 30.0


def _invalid(field: str, message: str) -> ApplicationError:
    return ApplicationError("invalid_catalogue", f"{field}: {message}", extra={"field": field})


def known_datasets() -> frozenset[str]:
    from reasoning_gym.factory import DATASETS  # the registry reasoning-gym builds its datasets from

    return frozenset(DATASETS)


def catalogue_entries_clean(entries: object) -> list[dict[str, Any]]:
    """The entries as stored: each dataset known to reasoning-gym, at most once, its config a JSON
    object reasoning-gym builds an entry with, its weight a positive number (default 1). Raises
    ApplicationError "invalid_catalogue" whose `field` names the first entry at fault
    (`entries[2].config`)."""
    if not isinstance(entries, list) or not entries:
        raise _invalid("entries", "a catalogue is a non-empty list of entries")
    if len(entries) > MAX_ENTRIES:
        raise _invalid("entries", f"at most {MAX_ENTRIES} entries")
    known = known_datasets()
    cleaned, seen = [], set()
    deadline = time.monotonic() + CHECK_SECONDS
    for i, entry in enumerate(entries):
        where = f"entries[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"dataset", "config", "weight"}:
            raise _invalid(where, "an entry is an object with dataset, config and weight")
        dataset = entry.get("dataset")
        if not isinstance(dataset, str) or dataset not in known:
            raise _invalid(f"{where}.dataset", f"{str(dataset)[:64]!r} is not a reasoning-gym dataset")
        if dataset in seen:
            raise _invalid(f"{where}.dataset", f"{dataset} is in the catalogue twice")
        seen.add(dataset)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise _invalid(f"{where}.config", "expected an object of keyword arguments")
        try:
            size = len(json.dumps(config, allow_nan=False))
        except (TypeError, ValueError):
            raise _invalid(f"{where}.config", "expected plain JSON values") from None
        if size > MAX_CONFIG_BYTES:
            raise _invalid(f"{where}.config", f"at most {MAX_CONFIG_BYTES} bytes of JSON")
        weight = entry.get("weight", 1)
        if type(weight) not in (int, float) or not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT:
            raise _invalid(f"{where}.weight", f"expected a number in (0, {MAX_WEIGHT:g}]")
        seconds = min(BUILD_WALL_SECONDS, max(0.0, deadline - time.monotonic()))
        spent = f"building the catalogue's entries took more than {CHECK_SECONDS:g} s in all, up to {dataset}"
        if seconds <= 0:  # no time left: a build that answers at once must not slip through
            raise _invalid(f"{where}.config", spent)
        try:
            build_first_bounded(dataset, config, cpu_seconds=BUILD_CPU_SECONDS, wall_seconds=seconds)
        except BuildTimeout as exc:
            if not exc.wall:
                why = f"reasoning-gym took more than {BUILD_CPU_SECONDS:g} CPU-s to build an entry of {dataset} with it"
            elif seconds < BUILD_WALL_SECONDS:  # the catalogue's time ran out first
                why = spent
            else:
                why = f"reasoning-gym took more than {seconds:g} s to build an entry of {dataset} with it"
            raise _invalid(f"{where}.config", why) from None
        except RuntimeError as exc:  # whatever reasoning-gym raised: the config is at fault
            raise _invalid(f"{where}.config", f"reasoning-gym cannot build {dataset} with it: {exc}"[:300]) from None
        cleaned.append({"dataset": dataset, "config": config, "weight": float(weight)})
    return cleaned


def catalogue_from_entries(
    *, name: str, entries: list[dict[str, Any]], withdrawn: frozenset[str] = frozenset()
) -> Catalogue:
    """The node protocol's catalogue of stored entries (what `welcome` sends and shares are verified
    against); `withdrawn`: the datasets earlier versions had that these entries do not."""
    return _catalogue(name, json.dumps(entries, sort_keys=True), tuple(sorted(withdrawn)))


@lru_cache(maxsize=256)
def _catalogue(name: str, entries_json: str, withdrawn: tuple[str, ...] = ()) -> Catalogue:
    # One object per (name, entries): sockets of a swarm's version share it, so pool.turns batches
    # their shares together and the welcome's JSON is encoded once per process.
    entries = json.loads(entries_json)
    return Catalogue(
        name=name,
        tasks=tuple(TaskSpec(e["dataset"], dict(e.get("config") or {})) for e in entries),
        weights=tuple(float(e.get("weight", 1.0)) for e in entries),
        withdrawn=frozenset(withdrawn) - {e["dataset"] for e in entries},
    )


def entries_of_catalogue(catalogue: Catalogue) -> list[dict[str, Any]]:
    """A named catalogue's tasks as entries of weight 1 (the default swarm's first version)."""
    return [{"dataset": t.dataset, "config": dict(t.config), "weight": 1.0} for t in catalogue.tasks]
