"""Running a benchmark script end to end from a test (no tests here): `from support.bench import run_bench`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, args: list[str], db_name: str, cwd: Path) -> str:
    """Run bench/<script> with `args` on DATABASE_URL's server (the local one by default), in a
    database of its own (`db_name` and this process's id), from `cwd`; its standard output. Fails
    the test with the end of its standard error when it exits with a status other than 0."""
    env = dict(os.environ)
    env.setdefault("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--db-name", f"{db_name}_{os.getpid()}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
