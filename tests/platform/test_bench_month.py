"""bench/month.py runs end to end at --quick size (its figures are docs/benchmarks.md's "A month")."""

from __future__ import annotations

import re

from support.bench import run_bench


def test_the_month_benchmark_prints_a_row_per_step_with_sane_figures_and_the_load(tmp_path):
    out = run_bench("month.py", ["--quick"], "sapo_bench_month", tmp_path)
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| groups | ledger GB"))
    rows = [line for line in lines[header + 2 :] if line.startswith("| ")][:3]
    assert len(rows) == 3, out  # the first day, then --quick's 2 steps
    groups = []
    for row in rows:
        cells = [c.strip() for c in row.strip(" |").split("|")]
        groups.append(int(cells[0].replace(",", "")))
        ingest = re.fullmatch(r"([\d,]+) \(([\d.]+)\)", cells[5])
        assert ingest and float(ingest[1].replace(",", "")) > 0 and float(ingest[2]) > 0, row
        sample = re.fullmatch(r"([\d.]+)/([\d.]+) \(([\d.]+)\)", cells[6])
        assert sample and 0 < float(sample[1]) <= float(sample[2]) < 10_000, row
        assert all(0 <= float(cells[i]) < 600 for i in range(7, 11)), row  # fold, badges, export, retention
        for page in cells[11:14]:
            assert re.fullmatch(r"\d+/\d+ \(uncached \d+/\d+\)", page), row
        assert re.fullmatch(r"[\d.]+-[\d.]+", cells[14]), row  # load average, start-end
    # The groups filled (20k) and those shared through the socket at each step are all counted.
    assert groups[0] < groups[1] < groups[2] and groups[2] >= 20_000, groups
    assert "bytes per group (table + indexes)" in out
    ledger = re.search(r"- ledger \(pool_rollout\): ([\d,]+) \+ ([\d,]+)", out)
    assert ledger and 100 < int(ledger[1].replace(",", "")) < 5_000, out
    retention = re.search(r"retention: (\d+) days aged out", out)
    assert retention and int(retention[1]) >= 15, out  # 30 days filled, 14 kept
    assert "load average at start" in out and "load average at end" in out
