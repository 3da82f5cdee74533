"""Seconds per round of an offline node at each --threads setting, alternating, with the load average.

    .venv/bin/python bench/threads.py                                # tiny-mini, --threads 1 and 2
    .venv/bin/python bench/threads.py --busy 2                       # the same beside 2 busy processes
    .venv/bin/python bench/threads.py --threads 1,2,0 --repeats 3    # 0: torch's default (all cores)

Each run is `sapo-node run --offline` of --rounds rounds in its own process (this checkout's
sapo_node); its first round (warm-up) is not counted. Runs alternate between the settings (A B, B A,
...) so each sees the same machine. --busy N starts N processes that spin on a core each, for the
whole measurement: a machine in use by other work. Prints each run's median s/round with the
load average before it, then each setting's median and its ratio to the first setting's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchkit import checkout_pythonpath


def spin() -> None:
    while True:
        pass


def run_offline(model: str, rounds: int, flags: list[str]) -> tuple[list[float], int, str]:
    """(seconds of each round after the first, peak resident bytes of the node's process, its
    config line) of one `sapo-node run --offline` in a fresh process and run folder."""
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as out:
        env = {**os.environ, "PYTHONPATH": checkout_pythonpath()}
        env.pop("OMP_NUM_THREADS", None)  # the node chooses, or the flag says
        command = [sys.executable, "-m", "sapo_node", "run", "--offline", "--model", model]
        command += ["--rounds", str(rounds), "--out", out, "--seed", "1", *flags]
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = process.stdout.read() if process.stdout else ""
        _pid, status, usage = os.wait4(process.pid, 0)
        if status != 0:
            raise SystemExit(f"{' '.join(command)} failed ({status}):\n{output[-3000:]}")
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
        seconds = [sum(row["seconds"].values()) for row in rows[1:]]
        line = next((text for text in output.splitlines() if text.startswith("config: ")), "")
        return seconds, usage.ru_maxrss * 1024, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-mini")
    parser.add_argument("--threads", default="1,2", help="comma-separated --threads values (0: torch's default)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds a run (the first is not counted)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on a core each meanwhile")
    args, extra = parser.parse_known_args()
    settings = [int(v) for v in args.threads.split(",")]
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    print(f"{os.cpu_count()} cores, {args.busy} busy processes, load {os.getloadavg()[0]:.2f} at the start")
    times: dict[int, list[float]] = {t: [] for t in settings}
    try:
        for repeat in range(args.repeats):
            order = settings if repeat % 2 == 0 else settings[::-1]
            for threads in order:
                load = os.getloadavg()[0]
                seconds, _peak, _line = run_offline(args.model, args.rounds, ["--threads", str(threads), *extra])
                times[threads] += seconds
                print(f"  --threads {threads}: {statistics.median(seconds):.2f} s/round (load {load:.2f} before)")
    finally:
        for process in spinners:
            process.terminate()
    first = statistics.median(times[settings[0]])
    for threads in settings:
        median = statistics.median(times[threads])
        print(
            f"{args.model} --threads {threads}: median {median:.2f} s/round over {len(times[threads])} rounds, "
            f"{median / first:.2f}x --threads {settings[0]}'s"
        )
    print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
