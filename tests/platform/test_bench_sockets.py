"""bench/sockets.py runs end to end at --quick size (its figures are docs/benchmarks.md's "Sockets")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_sockets_benchmark_runs_every_phase_and_every_node_comes_back(tmp_path):
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sockets.py"), "--quick", "--db-name", f"sapo_bench_sockets_{os.getpid()}"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for phase in ("(a) welcome, one at a time", "(b) welcome, all at once", "(c) sample, one at a time",
                  "(d) sample, all at once", "(e) server RSS", "(f) all back after a restart (from the kill)"):  # fmt: skip
        assert f"| {phase} |" in out
    assert "| 50 |" in out  # all 50 sockets measured
    assert "**0 dropped sessions**" in out
    assert "load average at start" in out and "load average at end" in out
    assert ": 0 errors" in out  # the server logged no error
