"""What the benchmark scripts share: bench/pool.py's helpers (servers, databases, nodes, the CPU of a
process) and the load average as they print it.

bench/pool.py is loaded by path, once: imported by its name it would be the platform's `pool` app.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


@functools.cache
def pool_bench() -> ModuleType:
    """bench/pool.py as a module (named `bench_pool`)."""
    spec = importlib.util.spec_from_file_location("bench_pool", HERE / "pool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def load() -> str:
    """The 1-minute load average, as printed beside every figure."""
    return f"{os.getloadavg()[0]:.2f}"
