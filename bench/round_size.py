"""Peak memory and seconds of a round, measured beside sapo_node.machine's estimates of them.

    .venv/bin/python bench/round_size.py                       # tiny-mini and smollm2-135m
    .venv/bin/python bench/round_size.py --cases smollm2-135m:4:4:64:8 --rounds 3

Each case MODEL:B:G:T:M is one `sapo-node run --offline --model MODEL --questions B --generations G
--max-new-tokens T --micro-batch M` of --rounds rounds in a fresh process (bench/threads.py's
run_offline): its peak resident set (wait4's ru_maxrss: model, optimizer, activations, runtime) and
the median seconds of its rounds after the first, against machine.peak_bytes and
machine.round_seconds. An estimate at or above the measurement keeps a default within the machine;
the ratios say how far above. The load average is printed beside each case.
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchkit import use_checkout
from threads import run_offline

use_checkout()

from sapo_node.machine import GIB, model_shape, peak_bytes, read_machine, round_seconds  # noqa: E402

CASES = (
    "tiny-mini:8:8:48:16",
    "tiny-mini:8:8:48:4",
    "smollm2-135m:2:2:32:4",
    "smollm2-135m:2:4:32:8",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="MODEL:B:G:T:M,...")
    parser.add_argument("--rounds", type=int, default=2, help="rounds a case (the first is not counted)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the start, --threads {args.threads}")
    for case in args.cases.split(","):
        model, *numbers = case.rsplit(":", 4)
        b, g, t, m = (int(n) for n in numbers)
        machine = read_machine("cpu")
        flags = ["--questions", str(b), "--generations", str(g), "--max-new-tokens", str(t), "--micro-batch", str(m)]
        seconds, peak, _line = run_offline(model, args.rounds, [*flags, "--threads", str(args.threads)])
        shape = model_shape(model)[0]
        estimate = peak_bytes(shape, b, g, t, m, "cpu")
        measured = statistics.median(seconds)
        guess = round_seconds(machine, shape, b, g, t, args.threads)
        print(
            f"{model} B {b} G {g} T {t} micro {m}: peak {peak / GIB:.2f} GiB, estimate {estimate / GIB:.2f} "
            f"({estimate / peak:.2f}x); {measured:.1f} s/round, estimate {guess:.1f} ({guess / measured:.2f}x); "
            f"load {machine.load:.2f} before"
        )
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
