"""A study with a pilot, corrected sharing and a slow server, end to end on the real platform: the
study's nodes share their groups with their log-probabilities (so a correcting node's external
completions are weighted), a pilot on seeds that are not counted chooses the configuration that stands
in for `pilot`, and an acknowledgement slower than --flush-wait is waited for with a line."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from research.heldout import read_heldout
from research.presets import PILOT, preset
from research.study import CHOICE_FILE, choose_pilot, pilot_accuracy, run_study

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CANDIDATES = ["4/4+tis", "4/4+gate"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("pilot")
    cfg = preset(
        "smoke",
        out=str(out),
        database_url=os.environ.get("DATABASE_URL", ""),
        configs=["8/0", PILOT],
        seeds=[1],
        pilot_seeds=[101],
        pilot_configs=CANDIDATES,
        rounds=3,
        heldout=2,
        datasets=["calendar_arithmetic", "basic_arithmetic"],
        flush_wait=1.0,
    )
    # The server stops answering for a while once node 1 has played its first round: node 2's turn ends
    # waiting for acknowledgements that come only after it goes on (a machine too busy to serve).
    first_round = out / "pilot" / "runs" / "4-4+tis-s101" / "node-1" / "metrics.jsonl"
    stall = threading.Thread(target=stall_server, args=(first_round, SERVER_STALL_SECONDS), daemon=True)
    stall.start()
    with contextlib.redirect_stderr(io.StringIO()) as stderr:
        summary = run_study(cfg, progress=False)
    stall.join(timeout=1)
    return cfg, out, summary, stderr.getvalue()


#: How long the test's server stalls: longer than a node's round under load, so a turn ends inside it.
SERVER_STALL_SECONDS = 40


def stall_server(after: Path, seconds: float) -> None:
    """Once `after` exists, stop this process' daphne child (SIGSTOP) for `seconds`, then continue it."""
    deadline = time.monotonic() + 600
    while not after.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    servers = [pid for pid in child_pids(os.getpid()) if b"daphne" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    for pid in servers:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in servers:
            os.kill(pid, signal.SIGCONT)


def child_pids(parent: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry.name))
    return pids


def read_csv(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_correcting_node_weighs_its_external_completions_by_their_sharers_logprobs(study):
    cfg, out, _, _ = study
    rows = [row for k in (1, 2) for row in metrics(out / "pilot" / "runs" / "4-4+tis-s101" / f"node-{k}")]
    assert sum(r["external_kept"] for r in rows) > 0
    # Every external group carried its sharer's log-probabilities for this node's tokens...
    assert sum(r["external_corrected"] for r in rows) == sum(r["external_kept"] for r in rows)
    assert sum(r["corrected"] for r in rows) > 0
    # ...and once the policies have moved apart the weights are not 1: the loss is not the uncorrected one.
    assert any(r["corrected"] and abs(r["correction_weight"] - 1.0) > 1e-4 for r in rows)
    plain = [row for k in (1, 2) for row in metrics(out / "pilot" / "runs" / "4-4+gate-s101" / f"node-{k}")]
    assert all(r["corrected"] == 0 for r in plain)  # the options are the configuration's, not the study's


def test_the_pilot_chooses_by_heldout_accuracy_and_its_choice_takes_the_pilots_place(study):
    cfg, out, summary, _ = study
    saved = json.loads((out / "pilot" / CHOICE_FILE).read_text())
    pilot_rows = read_heldout(out / "pilot" / "heldout.csv")
    assert saved["heldout_accuracy"] == pilot_accuracy(pilot_rows, CANDIDATES)
    assert saved["choice"] == choose_pilot(saved["heldout_accuracy"], CANDIDATES)
    counted = read_csv(out / "rounds.csv")
    assert {r["config"] for r in counted} == {"8/0", saved["choice"]}
    assert {r["seed"] for r in counted} == {"1"}  # the pilot's seed is not counted
    assert {r["seed"] for r in read_csv(out / "pilot" / "rounds.csv")} == {"101"}
    assert json.loads((out / "study.json").read_text())["configs"] == ["8/0", saved["choice"]]
    assert set(summary["heldout"]["runs"]) == {"8/0", saved["choice"]}
    # The nodes drew from the study's datasets only, and were evaluated on them.
    datasets = {q.split("/")[0] for r in counted for q in r["questions"].split(";")}
    assert datasets == {"calendar_arithmetic", "basic_arithmetic"}
    assert {r["dataset"] for r in read_heldout(out / "heldout.csv")} == datasets


def test_a_slow_acknowledgement_is_waited_for_with_a_line(study):
    cfg, out, _, stderr = study
    # Every run of the pilot and of the study finished although no acknowledgement came within flush_wait.
    assert len(read_csv(out / "rounds.csv")) == 2 * cfg.nodes * cfg.rounds
    assert len(read_csv(out / "pilot" / "rounds.csv")) == 2 * cfg.nodes * cfg.rounds
    # Node 1's report or node 2's shares, whichever the stall caught.
    assert re.search(r"the server has not acknowledged node \d's shares after \d+ s \(.*\); waiting", stderr)
    assert "Traceback" not in stderr


def test_a_resumed_study_keeps_the_pilots_choice_and_runs_nothing_again(study):
    cfg, out, _, _ = study
    saved = json.loads((out / "pilot" / CHOICE_FILE).read_text())
    before = (out / "rounds.csv").read_text(), (out / "pilot" / "rounds.csv").read_text()
    with contextlib.redirect_stderr(io.StringIO()):
        summary = run_study(cfg, resume=True, progress=False)
    assert summary["meta"]["study"]["configs"] == ["8/0", saved["choice"]]
    assert ((out / "rounds.csv").read_text(), (out / "pilot" / "rounds.csv").read_text()) == before


def test_pilot_choice_rule():
    assert choose_pilot({"a": 0.2, "b": 0.3}, ["a", "b"]) == "b"
    assert choose_pilot({"a": 0.3, "b": 0.3}, ["a", "b"]) == "a"  # a tie: the first listed
    assert choose_pilot({"a": None, "b": 0.1}, ["a", "b"]) == "b"
    with pytest.raises(ValueError, match="held-out"):
        choose_pilot({"a": None}, ["a"])
