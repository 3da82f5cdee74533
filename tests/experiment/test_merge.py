"""`python -m research --merge`: the finished runs of a study played in another folder join the study, the
folders' lock keeps a merge off a running study, and nothing is written when a check fails."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from research import main as experiment_main
from research.analysis import ROUND_FIELDS, read_rounds, write_rounds
from research.heldout import heldout_rows, read_heldout, write_heldout
from research.lock import LOCK_FILE, StudyBusy, study_lock
from research.merge import MergeError, merge_studies
from research.presets import parse_config, preset
from research.study import run_study

NODES, ROUNDS = 2, 3
DATASETS = ("basic_arithmetic", "base_conversion")
ROOT = Path(__file__).resolve().parents[2]


def study(folder: Path, runs: dict[tuple[str, int], int], *, evaluated: bool = True, **settings) -> Path:
    """A study folder as research.study leaves it: study.json, `runs[(config, seed)]` rows of each run in
    rounds.csv (NODES * ROUNDS is complete), the initial policy's held-out rows and each complete run's
    `after` rows (none when `evaluated` is False), and each run's folder of node metrics."""
    seeds = sorted({seed for _, seed in runs})
    cfg = preset("smoke", nodes=NODES, rounds=ROUNDS, seeds=seeds, configs=["8/0", "4/4"], heldout=10, out=str(folder))
    cfg = dataclasses.replace(cfg, **settings)
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save(folder / "study.json")
    rows, held = [], before_rows()
    for (config, seed), count in runs.items():
        local, external = parse_config(config)
        cells = [(node, n) for n in range(1, ROUNDS + 1) for node in range(1, NODES + 1)][:count]
        for node, n in cells:
            row = dict.fromkeys(ROUND_FIELDS, 0)
            row.update(config=config, local=local, external=external, seed=seed, node=node, round=n)
            row.update(reward_mean=round(0.01 * seed + 0.001 * node + 0.0001 * n, 6), questions=f"q/{seed}/{node}/{n}")
            rows.append(row)
        metrics = folder / "runs" / f"{config.replace('/', '-')}-s{seed}" / "node-1" / "metrics.jsonl"
        metrics.parent.mkdir(parents=True, exist_ok=True)
        metrics.write_text(f'{{"config": "{config}", "seed": {seed}, "rows": {count}}}\n')
        if evaluated and count == NODES * ROUNDS:
            for node in range(1, NODES + 1):
                held += heldout_rows(
                    scores(0.1 * seed), stage="after", model="tiny-mini", n=10, config=config, seed=seed, node=node
                )
    write_rounds(folder / "rounds.csv", rows)
    write_heldout(folder / "heldout.csv", held)
    return folder


def scores(accuracy: float) -> dict:
    return {d: {"accuracy": accuracy, "parsed": 1.0, "seconds": 1.0} for d in DATASETS}


def before_rows() -> list[dict]:
    return heldout_rows(scores(0.05), stage="before", model="tiny-mini", n=10)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a study folder but its lock (empty, made by whoever locks the folder)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def runs_in(folder: Path) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for row in read_rounds(folder / "rounds.csv"):
        counts[(row["config"], row["seed"])] = counts.get((row["config"], row["seed"]), 0) + 1
    return counts


FULL = NODES * ROUNDS


def test_complete_runs_of_another_folder_join_the_study_and_the_source_is_only_read(tmp_path, capsys):
    target = study(tmp_path / "a", {("8/0", 1): FULL, ("4/4", 1): FULL})
    source = study(tmp_path / "b", {("8/0", 2): FULL, ("4/4", 2): FULL, ("8/0", 3): 3}, threads=2)
    source_files = snapshot(source)

    assert experiment_main(["--merge", str(source), "--out", str(target)]) == 0

    said = capsys.readouterr().out
    assert f"merged into {target}: 4/4 seed 2, 8/0 seed 2" in said
    assert f"{target} holds 4 complete runs; `python -m research --analyze {target}`" in said
    assert runs_in(target) == {("8/0", 1): FULL, ("4/4", 1): FULL, ("8/0", 2): FULL, ("4/4", 2): FULL}
    source_rows = [r for r in read_rounds(source / "rounds.csv") if r["seed"] == 2]
    assert [r for r in read_rounds(target / "rounds.csv") if r["seed"] == 2] == source_rows
    held = read_heldout(target / "heldout.csv")
    assert len([r for r in held if r["stage"] == "before"]) == len(DATASETS)
    after = {(r["config"], r["seed"], r["node"], r["dataset"]) for r in held if r["stage"] == "after"}
    assert len(after) == 4 * NODES * len(DATASETS)
    assert (target / "runs" / "4-4-s2" / "node-1" / "metrics.jsonl").read_text() == (
        source / "runs" / "4-4-s2" / "node-1" / "metrics.jsonl"
    ).read_text()
    assert not (target / "runs" / "8-0-s3").exists()  # cut short there: not a run yet
    assert snapshot(source) == source_files

    # Merging again finds nothing new and changes nothing.
    merged_once = snapshot(target)
    with pytest.raises(MergeError, match="8/0 seed 2 finished both in"):
        merge_studies(target, [source])
    assert snapshot(target) == merged_once


def test_the_command_says_which_planned_runs_are_still_missing(tmp_path, capsys):
    target = study(tmp_path / "a", {("8/0", 1): FULL})
    source = study(tmp_path / "b", {("4/4", 1): FULL})
    # The target plans seeds 1 and 2.
    text = (target / "study.json").read_text().replace('"seeds": [\n    1\n  ]', '"seeds": [\n    1,\n    2\n  ]')
    (target / "study.json").write_text(text)

    assert experiment_main(["--merge", str(source), "--out", str(target)]) == 0

    said = capsys.readouterr().out
    assert "holds 2 complete runs; not yet run of its study.json's plan: 8/0 seed 2, 4/4 seed 2;" in said


def test_a_new_folder_becomes_the_study_of_several_sources(tmp_path):
    one = study(tmp_path / "b", {("8/0", 1): FULL})
    two = study(tmp_path / "c", {("4/4", 1): FULL})

    merged = merge_studies(tmp_path / "all", [one, two])

    assert merged.runs == [("8/0", 1), ("4/4", 1)]
    assert runs_in(tmp_path / "all") == {("8/0", 1): FULL, ("4/4", 1): FULL}
    assert (tmp_path / "all" / "study.json").read_text() == (one / "study.json").read_text()


def test_a_cut_short_try_in_the_study_is_replaced_by_the_finished_run(tmp_path):
    target = study(tmp_path / "a", {("8/0", 1): FULL, ("4/4", 1): 3})
    source = study(tmp_path / "b", {("4/4", 1): FULL})

    merge_studies(target, [source])

    assert runs_in(target) == {("8/0", 1): FULL, ("4/4", 1): FULL}
    assert '"rows": 6' in (target / "runs" / "4-4-s1" / "node-1" / "metrics.jsonl").read_text()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [("rounds", 4, "rounds: 3 here, 4 there"), ("model", "tiny", "model: 'tiny-mini' here, 'tiny' there")],
)
def test_another_experiment_is_refused_and_nothing_is_written(tmp_path, setting, value, message):
    target = study(tmp_path / "a", {("8/0", 1): FULL})
    source = study(tmp_path / "b", {("4/4", 1): FULL}, **{setting: value})
    before = snapshot(target)

    with pytest.raises(MergeError, match=f"is another experiment \\({message}\\)"):
        merge_studies(target, [source])

    assert snapshot(target) == before


def test_a_run_without_its_held_out_evaluation_is_not_taken(tmp_path, capsys):
    target = study(tmp_path / "a", {("8/0", 1): FULL})
    source = study(tmp_path / "b", {("4/4", 1): FULL}, evaluated=False)
    before = snapshot(target)

    assert experiment_main(["--merge", str(source), "--out", str(target)]) == 0

    assert "none (no complete run to take)" in capsys.readouterr().out
    assert snapshot(target) == before


def test_bad_folders_get_a_typed_error(tmp_path, capsys):
    target = study(tmp_path / "a", {("8/0", 1): FULL})
    with pytest.raises(MergeError, match="holds no study"):
        merge_studies(target, [tmp_path / "nothing"])
    with pytest.raises(MergeError, match="holds no study"):
        merge_studies(tmp_path / "new", [tmp_path / "nothing"])
    assert not (tmp_path / "new").exists() and not (tmp_path / "nothing").exists()
    with pytest.raises(MergeError, match="cannot also be a source"):
        merge_studies(target, [target])
    assert experiment_main(["--merge", str(target)]) == 2
    assert "--merge needs --out" in capsys.readouterr().err


def test_a_study_running_in_a_folder_keeps_a_merge_and_a_second_study_out(tmp_path, capsys):
    target = study(tmp_path / "a", {("8/0", 1): FULL})
    source = study(tmp_path / "b", {("4/4", 1): FULL})
    before = snapshot(target)
    # Another process holds the target's lock, as a running study does.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from research.lock import study_lock\n"
            f"with study_lock({str(target)!r}):\n    print('held', flush=True); time.sleep(60)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StudyBusy, match="in use by another process"):
            merge_studies(target, [source])
        assert experiment_main(["--merge", str(source), "--out", str(target)]) == 2
        assert "in use by another process" in capsys.readouterr().err
        cfg = preset("smoke", out=str(target))
        with pytest.raises(StudyBusy):
            run_study(cfg, resume=True, progress=False)
        assert snapshot(target) == before
    finally:
        holder.kill()
        holder.wait()
    # The kernel drops the lock with its process, however it ended.
    deadline = time.monotonic() + 10
    while True:
        try:
            with study_lock(target):
                break
        except StudyBusy:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert merge_studies(target, [source]).runs == [("4/4", 1)]
    assert (target / LOCK_FILE).exists()
