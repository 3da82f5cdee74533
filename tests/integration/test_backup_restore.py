"""A backup restored under running nodes loses no group they hold (docs/deploy.md, "Backups and
restore"): bench/restore.py on its own PostgreSQL (pg_dump while the nodes share, more groups
acknowledged after it, pg_restore into a database created again), asserted here with few nodes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_every_acknowledged_group_is_back_after_a_restore_under_running_nodes() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    result = subprocess.run(
        [sys.executable, "bench/restore.py", "--nodes", "2", "--before", "3", "--after", "6"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    out = result.stdout + result.stderr
    held = int(re.search(r"(\d+) groups acknowledged in all", out).group(1))
    lost = int(re.search(r"the database lacks (\d+) of them", out).group(1))
    assert held >= 18 and lost >= 12, out  # the restore did lose what came after the dump
    assert "once the nodes reconnected: 0 missing" in out, out[-3000:]
    assert result.returncode == 0, out[-3000:]
