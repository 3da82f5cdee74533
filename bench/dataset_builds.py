"""What a share naming a costly dataset's fresh seed costs the server, per frame: CPU seconds of the
verifying thread, of the worker processes that measured or built the dataset for it, what the share
was charged (ShareResult.verification_seconds), and the process's resident memory, in process
(`rollout_share`, no daphne), for one tree or several in alternation.

    .venv/bin/python bench/dataset_builds.py                      # this tree
    .venv/bin/python bench/dataset_builds.py --trees /tmp/base,.  # two trees, one after the other, twice
    .venv/bin/python bench/dataset_builds.py --trees /tmp/base,. --stall 11  # each worker stopped 11 s

The swarm's catalogue is a count_primes of max_n 40 million (`--max-n`: a sieve of 40 million flags
for every seed, 3 to 5 CPU-s, which passes the catalogue check) and basic_arithmetic. Each frame is one group of count_primes
(2.6 KB: a made-up question, which the server can only find wrong once it has built the dataset):
`--frames` with fresh seeds the node chose (no proof), then as many with the task seed of a fresh
challenge the server issued to the node (a proof naming it). The first frame's share pays for the
dataset's measurement, where a tree charges it. Each tree runs in a subprocess with its
own `platform` and `node_client` on its path, in a database of its own on DATABASE_URL's server
(created, migrated, dropped). Prints the load average with each run. `--stall`: each worker that
measures or builds the dataset is stopped (SIGSTOP) for that many seconds in the middle of its build,
as a loaded machine keeps a process off the CPU: its wall clock grows, its CPU does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchkit import descendants, load, stall_next_worker, tree_run

HERE = Path(__file__).resolve().parent
COSTLY = {"dataset": "count_primes", "config": {"min_n": 1, "max_n": 40_000_000}, "weight": 1.0}
CHEAP = {"dataset": "basic_arithmetic", "config": {}, "weight": 1.0}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", default=".", help="comma-separated source trees (default: this one)")
    parser.add_argument("--frames", type=int, default=3, help="frames of each kind per run")
    parser.add_argument("--runs", type=int, default=2, help="runs of each tree, in alternation")
    parser.add_argument("--max-n", type=int, default=40_000_000, help="count_primes' max_n (its sieve's flags)")
    parser.add_argument("--stall", type=float, default=0.0, help="seconds each worker is stopped in its build")
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--db-name", default="sapo_bench_builds", help=argparse.SUPPRESS)
    return parser.parse_args()


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _group(seed: int, challenge: str | None) -> dict:
    from sapo_node import proof
    from sapo_node.ids import uuid7

    completions = [f"Let me count. <answer>{n}</answer>" for n in range(8)]
    group = {
        "id": str(uuid7()),
        "round": 1,
        "task": {"dataset": COSTLY["dataset"], "seed": seed, "index": 3},
        "question": "Count how many prime numbers there are between 1 and 2 (inclusive) ?",
        "answer": "1",
        "completions": completions,
        "rewards": [0.0] * len(completions),
    }
    if challenge is not None:
        group["proof"] = {
            "challenge": challenge,
            "weights": "ab" * 32,
            "model": "tiny-mini",
            "temperature": 1.0,
            "tokens": [proof.encode_ids([1, 2, 3]) for _ in completions],
            "logprobs": [proof.encode_floats([-0.25] * 3) for _ in completions],
        }
    return group


def child(args: argparse.Namespace) -> None:
    args.catalogue = "easy"
    with tree_run(args) as bench_pool:
        run(bench_pool, args.frames, args.stall)


def run(bench_pool, count: int, stall: float) -> None:  # noqa: ANN001
    from accounts.services import user_create
    from pool.challenges import challenge_mint
    from pool.ingest import rollout_share
    from pool.ingest_statement import SwarmOfBatch
    from pool.limits import current_limits
    from sapo_node import proof
    from sockets.messages import parse_frame
    from swarms.models import SwarmCatalogue
    from swarms.selectors import swarm_place
    from swarms.services import swarm_create

    staff = user_create(username="staff", display_name="staff", password=None)
    staff.is_staff = True
    staff.save()
    # The costly entry stored as the check would store it, without the check: a tree whose bound is
    # wall clock refuses it on a loaded machine.
    swarm = swarm_create(actor=staff, slug="primes", title="Primes", entries=[CHEAP])
    SwarmCatalogue.objects.create(swarm=swarm, version=2, entries=[COSTLY, CHEAP], created_by=staff)
    swarm.catalogue_version = 2
    swarm.save(update_fields=["catalogue_version"])
    place = swarm_place(swarm=swarm)
    ((node, _),) = bench_pool.make_nodes(1, f"b{uuid.uuid4().hex[:6]}")
    limits = current_limits()
    frames = []
    for k in range(count):
        frames.append(("node's seed", _group(5000 + k, None)))
    for _ in range(count):
        challenge = challenge_mint(node.id)
        frames.append(("issued seed", _group(proof.task_seed(challenge), challenge)))
    start_rss = _status("VmRSS")
    out = []
    for kind, group in frames:
        text = json.dumps({"type": "share", "v": 1, "rollouts": [group]})
        message = parse_frame(text, limits)
        done = threading.Event()
        with ThreadPoolExecutor(1) as staller:
            # The sieve's first 24 MiB: the worker is in its build.
            stalled = staller.submit(stall_next_worker, descendants(os.getpid()), stall, 24, done) if stall else None
            t0, wall0 = time.thread_time(), time.monotonic()
            result = rollout_share(
                node=node,
                rollouts=message.rollouts,
                catalogue=place.catalogue,
                limits=limits,
                swarm=SwarmOfBatch(place.swarm_id, place.catalogue_version),
            )
            cpu, wall = time.thread_time() - t0, time.monotonic() - wall0
            done.set()
        reason = result.rejected[0]["reason"] if result.rejected else "accepted"
        out.append(
            {
                "kind": kind,
                "bytes": len(text),
                "cpu_s": round(cpu, 3),
                "wall_s": round(wall, 1),
                "stalled": stalled is not None and stalled.result() is not None,
                "workers_s": round(getattr(result, "worker_seconds", 0.0), 3),
                "charged_s": round(result.verification_seconds, 3),
                "rss_growth_mib": round((_status("VmRSS") - start_rss) / 2**20, 1),
                "verdict": reason,
            }
        )
    measured = "n/a (no pool.builds in this tree)"
    try:
        from pool import builds
    except ImportError:
        pass
    else:  # what the tree's process measured of the dataset (memoized: no second worker)
        cost = builds.build_cost(place.catalogue.get(COSTLY["dataset"]))
        measured = (
            "not buildable within the bounds"
            if cost is None
            else f"{cost.cpu_seconds:.2f} CPU-s, {cost.peak_bytes / 2**20:.0f} MiB"
        )
    peak = round((_status("VmHWM") - start_rss) / 2**20, 1)
    print(json.dumps({"frames": out, "peak_growth_mib": peak, "measured": measured}))


def main() -> None:
    args = parse_args()
    COSTLY["config"]["max_n"] = args.max_n
    if args.child:
        child(args)
        return
    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    for run_no in range(args.runs):
        for tree in trees if run_no % 2 == 0 else reversed(trees):
            argv = [sys.executable, __file__, "--child", tree, "--frames", str(args.frames), "--max-n", str(args.max_n)]
            argv += ["--database-url", args.database_url, "--stall", str(args.stall)]
            before = load()
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(done.stdout + done.stderr)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            print(
                f"tree {tree} run {run_no + 1} (load {before} -> {load()}): peak growth {result['peak_growth_mib']} MiB;"
                f" the dataset measured: {result['measured']}"
            )
            for frame in result["frames"]:
                print(
                    f"  {frame['kind']:<12} {frame['bytes']:>5} B  {frame['cpu_s']:>6.3f} CPU-s here"
                    f" + {frame['workers_s']:>6.3f} in workers, {frame['charged_s']:>6.3f} charged"
                    f"  RSS +{frame['rss_growth_mib']:>6.1f} MiB  {frame['wall_s']:>5.1f} s"
                    f"{' (stalled)' if frame['stalled'] else ''}  {frame['verdict']}"
                )


if __name__ == "__main__":
    main()
