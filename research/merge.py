"""Bring the finished runs of other study folders into a study:

    .venv/bin/python -m research --merge var/study-b[,var/study-c] --out docs/experiment/cpu-real-hard

Every run of a study is independent of the others (its own pool, server and node seeds; the seed fixes
its initial weights and question streams), so one study's runs may be played by several processes at
once, each with other `--seeds` or `--configs` and an `--out` of its own, and brought together here.
A run is taken when it is complete in its folder: all of its rows in rounds.csv and, where the study
evaluates held-out questions, every node's `after` rows in heldout.csv. Its run folder (runs/<run>/:
the nodes' metrics) comes with it. The folders must be one experiment: study.json may differ only in
the settings that say where and how it ran (RUN_FIELDS). Nothing is written when any check fails: a
run finished in two folders, a different experiment, a study still running in one of the folders
(research.lock). The sources are only read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from research import heldout
from research.analysis import read_rounds, write_rounds
from research.heldout import HELDOUT_FILE
from research.lock import study_lock
from research.presets import StudyConfig
from research.study import complete_runs, run_folder

#: StudyConfig fields that say where and how a study ran, or how it is analysed, not what a run is:
#: folders that differ in them still hold runs of one experiment. Every other field must be equal.
RUN_FIELDS = frozenset(
    {
        "preset",
        "seeds",
        "configs",
        "out",
        "platform_root",
        "database_url",
        "flush_wait",
        "connect_wait",
        "time_limit",
        "parallel",
        "threads",
        "pilot_seeds",
        "pilot_configs",
        "window",
        "test",
        "sig_window",
        "cost_levels",
    }
)


class MergeError(ValueError):
    """The folders cannot be merged; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Merged:
    runs: list[tuple[str, int]]
    """(configuration, seed) of each run taken, in the order taken."""
    complete: list[tuple[str, int]]
    """Every complete run of the target afterwards."""
    planned: list[tuple[str, int]]
    """Every run the target's study.json plans (its seeds times its configurations)."""


def merge_studies(target: Path, sources: Sequence[Path]) -> Merged:
    """Copy the complete runs of `sources` into the study in `target` (made from the first source's
    study.json when it has none). Raises MergeError, or StudyBusy while a study runs in one of them."""
    target = Path(target)
    sources = [Path(s) for s in sources]
    if not sources:
        raise MergeError("no folder to merge from")
    if any(s.resolve() == target.resolve() for s in sources):
        raise MergeError(f"{target} is the folder merged into: it cannot also be a source")
    for folder in sources:
        if not (folder / "rounds.csv").exists():
            raise MergeError(f"{folder} holds no study (no rounds.csv)")
    with contextlib.ExitStack() as locks:
        for folder in (target, *sources):
            locks.enter_context(study_lock(folder))
        cfg = _study_config(target if (target / "study.json").exists() else sources[0])
        rows = _read_rounds(target)
        held = heldout.read_heldout(target / HELDOUT_FILE)
        have = _complete(cfg, rows, held)
        taken: list[tuple[str, int]] = []
        copies: list[tuple[Path, Path]] = []
        for source in sources:
            _check_same_experiment(cfg, _study_config(source), source)
            source_rows = read_rounds(source / "rounds.csv")
            source_held = heldout.read_heldout(source / HELDOUT_FILE)
            runs = sorted(_complete(cfg, source_rows, source_held), key=lambda run: (run[1], run[0]))
            both = [run for run in runs if run in have]
            if both:
                raise MergeError(
                    f"{_names(both)} finished both in {target} and in {source}: keep one and remove the other"
                )
            if not runs:
                continue
            runs_set = set(runs)
            rows = [r for r in rows if (r["config"], r["seed"]) not in runs_set]  # a target's cut-short try
            rows += [r for r in source_rows if (r["config"], r["seed"]) in runs_set]
            held = [r for r in held if r["stage"] == "before" or (r["config"], r["seed"]) not in runs_set]
            known = heldout.evaluated_models(held)
            held += [r for r in source_held if r["stage"] == "before" and r["model"] not in known]
            held += [r for r in source_held if r["stage"] == "after" and (r["config"], r["seed"]) in runs_set]
            copies += [(source / "runs" / run_folder(*run), target / "runs" / run_folder(*run)) for run in runs]
            have |= runs_set
            taken += runs
        if taken:
            _write(target, cfg, rows, held, copies)
        return Merged(
            runs=taken,
            complete=sorted(have, key=lambda run: (run[1], run[0])),
            planned=[(config, seed) for seed in cfg.seeds for config in cfg.configs],
        )


def _study_config(folder: Path) -> StudyConfig:
    path = folder / "study.json"
    try:
        return StudyConfig.load(path)
    except OSError:
        raise MergeError(f"{folder} has no study.json: not a study folder") from None
    except ValueError as exc:
        raise MergeError(f"{path} is not JSON: {exc}") from None


def _check_same_experiment(cfg: StudyConfig, other: StudyConfig, source: Path) -> None:
    ours, theirs = cfg.to_json(), other.to_json()
    differ = [name for name in ours if name not in RUN_FIELDS and ours[name] != theirs.get(name)]
    if differ:
        detail = "; ".join(f"{name}: {ours[name]!r} here, {theirs.get(name)!r} there" for name in differ)
        raise MergeError(f"{source} is another experiment ({detail})")


def _read_rounds(folder: Path) -> list[dict[str, Any]]:
    return read_rounds(folder / "rounds.csv") if (folder / "rounds.csv").exists() else []


def _complete(cfg: StudyConfig, rows: Sequence[dict[str, Any]], held: Sequence[dict[str, Any]]) -> set[tuple[str, int]]:
    """Runs with all their rounds and, where the study evaluates held-out questions, all their `after` rows
    (every node on every dataset the initial policy was evaluated on)."""
    runs = complete_runs(list(rows), cfg)
    if not cfg.heldout:
        return runs
    datasets = {r["dataset"] for r in held if r["stage"] == "before"}
    evaluated: dict[tuple[str, int], set[tuple[int, str]]] = {}
    for r in held:
        if r["stage"] == "after":
            evaluated.setdefault((r["config"], r["seed"]), set()).add((r["node"], r["dataset"]))
    wanted = {(node, d) for node in range(1, cfg.nodes + 1) for d in datasets}
    return {run for run in runs if datasets and evaluated.get(run, set()) >= wanted}


def _names(runs: Iterable[tuple[str, int]]) -> str:
    return ", ".join(f"{config} seed {seed}" for config, seed in runs)


def _write(
    target: Path,
    cfg: StudyConfig,
    rows: list[dict[str, Any]],
    held: list[dict[str, Any]],
    copies: list[tuple[Path, Path]],
) -> None:
    """Run folders first, then heldout.csv and rounds.csv, each replaced whole: a merge cut anywhere leaves
    the target's files as they were or as they should be, never half written."""
    target.mkdir(parents=True, exist_ok=True)
    if not (target / "study.json").exists():
        cfg.save(target / "study.json")
    for src, dst in copies:
        if src.is_dir():
            partial = dst.with_name(dst.name + ".merging")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.copytree(src, partial, ignore=shutil.ignore_patterns("outbox.sqlite3*"))
            shutil.rmtree(dst, ignore_errors=True)  # the target's own try of the run, cut short
            partial.rename(dst)
    if held:
        _replace(target / HELDOUT_FILE, lambda path: heldout.write_heldout(path, held))
    _replace(target / "rounds.csv", lambda path: write_rounds(path, rows))


def _replace(path: Path, write: Any) -> None:
    temporary = path.with_name(path.name + ".merging")
    write(temporary)
    os.replace(temporary, path)
