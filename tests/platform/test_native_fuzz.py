"""A short run of bench/native_fuzz.py: the C extension built with AddressSanitizer and UBSan from
native/'s source, every function against its twin on random and hostile inputs (lists changed under a
call, wrong element types), for a few seconds from a fixed seed. The long run and its figures:
docs/benchmarks.md, "The C extension under sanitizers"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "bench" / "native_fuzz.py"


@pytest.mark.timeout(300)
def test_the_sanitized_extension_agrees_with_its_twins_and_never_crashes():
    run = subprocess.run(
        [sys.executable, str(FUZZ), "--seconds", "5", "--seed", "20261127"], capture_output=True, text=True, timeout=280
    )
    report = run.stdout + run.stderr[-4000:]
    assert run.returncode == 0, report
    built, agreed = run.stdout.splitlines()[-2:]
    assert "sapo-native-asan-" in built  # the sanitized build ran, not the installed one
    rounds = int(agreed.split()[0])
    assert rounds >= 20 and "rounds agreed" in agreed, report
