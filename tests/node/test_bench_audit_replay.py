"""bench/audit_replay.py's durable mode: a run cut short and resumed adds the groups its file lacks, each
once, the same ones an uncut run makes; --summary tallies every piece (docs/benchmarks.md's "Audit
replay", docs/audits.md's "Cost")."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
TINY = ["--models", "tiny-mini", "--dtypes", "float32"]


def _bench(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / "audit_replay.py"), *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def audit_replay():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_audit_replay", BENCH / "audit_replay.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their annotations up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    yield module
    del sys.modules[spec.name]
    sys.path.remove(str(BENCH))


def test_the_upper_bound_is_clopper_pearsons(audit_replay):
    # scipy.stats.beta.ppf(0.95, k + 1, n - k)
    assert audit_replay.clopper_pearson_upper(0, 1000) == pytest.approx(0.0029912495, rel=1e-6)
    assert audit_replay.clopper_pearson_upper(1, 100) == pytest.approx(0.0465598115, rel=1e-6)
    assert audit_replay.clopper_pearson_upper(3, 1000) == pytest.approx(0.0077352447, rel=1e-6)
    assert audit_replay.clopper_pearson_upper(5, 5) == 1.0


def test_a_run_cut_and_resumed_loses_and_repeats_no_group_and_the_summary_tallies_its_pieces(audit_replay, tmp_path):
    out = tmp_path / "honest.jsonl"
    cut = subprocess.Popen(
        [sys.executable, str(BENCH / "audit_replay.py"), *TINY, "--groups", "1000", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 120
    while (not out.exists() or out.read_text().count("\n") < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    cut.send_signal(signal.SIGKILL)
    cut.wait()
    with out.open("a") as f:  # the run cut in the middle of a line
        f.write('{"model":"tiny-mini","dtype":"floa')
    held = out.read_text().count("\n")
    assert 2 <= held < 1000

    with pytest.raises(AssertionError, match="--resume adds to them"):
        _bench(*TINY, "--groups", str(held + 3), "--out", str(out), cwd=tmp_path)
    _bench(*TINY, "--groups", str(held + 3), "--out", str(out), "--resume", cwd=tmp_path)
    resumed = _lines(out)
    assert sorted(r["group"] for r in resumed) == list(range(held + 3))

    whole = tmp_path / "whole.jsonl"
    _bench(*TINY, "--groups", str(held + 3), "--out", str(whole), cwd=tmp_path)
    questions = {(r["group"], r["dataset"], r["task_seed"], r["index"]) for r in _lines(whole)}
    assert {(r["group"], r["dataset"], r["task_seed"], r["index"]) for r in resumed} == questions

    n = held + 3
    assert all(r["passed"] for r in resumed)
    summary = _bench("--summary", str(out), cwd=tmp_path)
    assert f"tiny-mini float32 audited in float32 (cached): {n} groups, {8 * n} completions" in summary
    assert f": 0/{n} groups, false-positive rate 0 (95% upper bound {1 - 0.05 ** (1 / n):.2g})" in summary

    # Two pieces of the same groups, one of them failed: each group counted once, the failure tallied.
    pieces = tmp_path / "pieces.jsonl"
    failed = dict(resumed[0], passed=False)
    pieces.write_text("".join(json.dumps(r) + "\n" for r in [failed, *resumed[1:], *resumed]))
    summary = "\n".join(audit_replay.summary(audit_replay.read_records(pieces)))
    assert f": {n} groups," in summary and f": 1/{n} groups, false-positive rate {1 / n:.2g}" in summary
    assert f"{n} repeated groups counted once" in summary


def test_groups_generated_on_a_gpu_are_cases_of_their_own_and_older_lines_were_generated_on_the_cpu(
    audit_replay, tmp_path
):
    out = tmp_path / "honest.jsonl"
    _bench(*TINY, "--groups", "2", "--out", str(out), cwd=tmp_path)
    lines = _lines(out)
    assert [r["device"] for r in lines] == ["cpu", "cpu"]
    older = [{k: v for k, v in r.items() if k != "device"} for r in lines]  # written before the field
    on_gpu = [dict(r, device="cuda", passed=False) for r in lines]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in [*older, *on_gpu]))
    summary = "\n".join(audit_replay.summary(audit_replay.read_records(mixed)))
    assert "tiny-mini float32 audited in float32 (cached): 2 groups" in summary
    assert "tiny-mini float32 generated on cuda audited in float32 (cached): 2 groups" in summary
    assert ": 2/2 groups" in summary and ": 0/2 groups" in summary
    if not audit_replay.torch.cuda.is_available():
        done = subprocess.run(
            [sys.executable, str(BENCH / "audit_replay.py"), *TINY, "--generate-device", "cuda"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and "--generate-device cuda: no such device here" in done.stderr
