"""A study stopped by Ctrl-C keeps every finished round and stops at a round boundary with no
traceback; --resume finishes it; --parallel runs configurations side by side as processes. Run as a
user runs them: `python -m research` from the repository root, against the real platform."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NODES = 2  # the smoke preset's
ROOT = Path(__file__).resolve().parents[2]


def experiment(out: Path, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "research",
        "--preset",
        "smoke",
        "--out",
        str(out),
        "--no-progress",
        *flags,
    ]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'node_client'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_ctrl_c_stops_at_a_round_boundary_keeps_the_rounds_and_resume_finishes(tmp_path):
    out = tmp_path / "study"
    flags = ("--configs", "8/0,4/4", "--rounds", "4")
    proc = subprocess.Popen(
        experiment(out, *flags), env=env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while len(rows(out / "rounds.csv")) < NODES and time.monotonic() < deadline:  # round 1 of 8/0 is written
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "stopped (interrupted) at a round boundary" in stderr
    kept = rows(out / "rounds.csv")
    assert kept and len(kept) % NODES == 0 and len(kept) < 2 * 4 * NODES  # whole rounds, not the whole study
    assert [int(r["round"]) for r in kept[::NODES]] == list(range(1, len(kept) // NODES + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["partial_runs"] == ["8/0 seed 1"] or "table" in summary
    # The held-out evaluation comes before a run's last round: only a run that finished has it.
    finished = {r["config"] for r in kept if int(r["round"]) == 4}
    assert {r["config"] for r in rows(out / "heldout.csv") if r["stage"] == "after"} == finished

    again = subprocess.run(experiment(out, *flags), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--resume" in again.stderr  # a study is never overwritten

    done = subprocess.run(
        experiment(out, *flags, "--resume"), env=env(), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    final = rows(out / "rounds.csv")
    assert len(final) == 2 * 4 * NODES
    assert {(r["config"], int(r["round"])) for r in final} == {(c, n) for c in ("8/0", "4/4") for n in range(1, 5)}
    assert "| 4/4 |" in (out / "table.md").read_text()
    held = rows(out / "heldout.csv")
    assert len([r for r in held if r["stage"] == "before"]) == 4  # the initial policy once, per dataset
    assert sorted(
        (r["config"], r["node"]) for r in held if r["stage"] == "after" and r["dataset"] == "base_conversion"
    ) == [(c, str(k)) for c in ("4/4", "8/0") for k in (1, 2)]


def test_parallel_configurations_run_as_processes_and_merge_into_one_study(tmp_path):
    out = tmp_path / "study"
    done = subprocess.run(
        experiment(out, "--configs", "8/0,4/4", "--rounds", "2", "--parallel", "2"),
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    merged = rows(out / "rounds.csv")
    assert sorted({r["config"] for r in merged}) == ["4/4", "8/0"] and len(merged) == 2 * 2 * NODES
    for label in ("8-0", "4-4"):  # each configuration had its own process, server and pool
        part = out / "parts" / label
        assert len(rows(part / "rounds.csv")) == 2 * NODES
        assert list((part / "logs").glob("*.log"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["parallel"] == 2 and len(summary["meta"]["run_seconds"]) == 2
    assert [r["config"] for r in summary["table"]] == ["8/0", "4/4"]
    held = rows(out / "heldout.csv")  # both parts evaluated the initial policy: kept once
    assert len([r for r in held if r["stage"] == "before"]) == 4
    assert sorted({r["config"] for r in held if r["stage"] == "after"}) == ["4/4", "8/0"]
    assert "after 4/4" in (out / "endpoints.md").read_text()
