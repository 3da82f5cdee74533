"""Build (or load) the study's model on the GPU and write the build's timings: deploy/gpu/study.sh's
first step. A file, not a program on standard input: the build's entry workers are spawned, and a
spawned process re-imports its parent's main program from its file."""

from __future__ import annotations

import json
import sys
import time

from sapo_node.models import load_policy
from sapo_node.tiny.cache import build_info, tiny_path
from sapo_node.tiny.variants import VARIANTS


def main(model: str, out: str) -> None:
    started = time.perf_counter()
    load_policy(model, device="auto")
    info = build_info(tiny_path(model)) if model in VARIANTS else {}
    info = {**(info or {}), "load_or_build_seconds": round(time.perf_counter() - started, 1)}
    with open(out, "w") as f:
        f.write(json.dumps(info, indent=2) + "\n")
    keys = ("params", "warm_start_seconds", "format_seconds", "entry_workers", "device", "load_or_build_seconds")
    print(json.dumps({k: info.get(k) for k in keys}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
