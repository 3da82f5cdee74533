"""bench/attack.py runs end to end at smoke sizes (its figures are docs/benchmarks.md's)."""

from __future__ import annotations

from support.bench import run_bench


def test_the_attack_benchmark_runs_and_reports_every_part(tmp_path):
    out = run_bench("attack.py", ["--smoke"], "sapo_bench_attack", tmp_path)
    # (a) the eval payload ran under reasoning-gym and not under ours; the power tower was stopped.
    assert "| binary_matrix | eval that writes a file |" in out and "| yes |" in out
    assert "killed at 1 s (CPU limit)" in out
    # (b) and (c): every table, with a load average beside each figure.
    for heading in ("(b) the honest path", "worst answer at each dataset's length cap", "(c) live"):
        assert heading in out
    live = out.split("(c) live")[1]
    # every attack and its control once (one pair each at smoke size), then the medians
    rows = [line for line in live.splitlines() if line.startswith("| ") and "| 1 |" in line]
    assert len(rows) == 4 and sum("| control" in r for r in rows) == 2 and "(the reported attack)" in rows[0]
    assert "median p50 / quiet over the pairs" in live
