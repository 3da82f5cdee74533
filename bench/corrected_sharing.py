"""A short pilot of corrected and gated sharing (docs/node.md, "Corrected and gated sharing"): N nodes of
one built-in model in one process, round-robin, sharing through an in-memory pool under one challenge (so
every group carries its sharer's log-probabilities), for each option set and seed.

    SAPO_CACHE=var/test-cache .venv/bin/python bench/corrected_sharing.py [--nodes 4] [--rounds 20] \\
        [--seeds 1,2] [--model tiny-mini] [--sets plain,token,token+filter,gate+zone]

Prints per option set and seed the cumulative own reward (the sum over nodes and rounds of each node's
mean reward in the round), the external groups trained on, how many carried usable log-probabilities,
the mean token weight, the completions filtered, and the seconds, with the load average beside. A
pilot, not a study: the pool here does not re-verify (each receiving node does), and a few seeds of a
few rounds cannot tell gains of a few percent apart."""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from sapo_node.config import NodeConfig  # noqa: E402
from sapo_node.loop import load_model, play_round, start_node  # noqa: E402
from sapo_node.tasks import EASY_CATALOGUE  # noqa: E402
from sapo_node.transport.memory import MemoryPool, MemoryTransport  # noqa: E402

#: Option sets by name: the NodeConfig fields each sets.
SETS = {
    "plain": {},
    "token": {"correction": "token"},
    "sequence": {"correction": "sequence"},
    "token+filter": {"correction": "token", "offpolicy_filter": 0.5},
    "gate": {"success_gate": True},
    "zone": {"learning_zone_low": 0.1, "learning_zone_high": 0.9},
    "gate+zone": {"success_gate": True, "learning_zone_low": 0.1, "learning_zone_high": 0.9},
}


def run(name: str, seed: int, args: argparse.Namespace, initial: tuple, folder: Path) -> dict:
    pool = MemoryPool(EASY_CATALOGUE, seed=seed, challenge=f"pilot-{seed}")
    nodes = []
    for k in range(args.nodes):
        config = NodeConfig(
            offline=False,
            model=args.model,
            out=str(folder / f"{name}-s{seed}" / f"node-{k}"),
            seed=seed * 1000 + k,
            rounds=args.rounds,
            questions=4,
            generations=8,
            local=2,
            external=2,
            max_new_tokens=16,
            lr=args.lr,
            micro_batch=16,
            threads=1,
            checkpoint_every=0,
            connect_wait=0,
            flush_wait=0,
            **SETS[name],
        )
        with contextlib.redirect_stdout(io.StringIO()):
            nodes.append(start_node(config, MemoryTransport(pool, f"node-{k}"), policy=copy.deepcopy(initial)))
    started = time.monotonic()
    rows = []
    for _ in range(args.rounds):
        for node in nodes:
            rows.append(play_round(node))
    return {
        "reward": sum(r["reward_mean"] for r in rows),
        "external_kept": sum(r["external_kept"] for r in rows),
        "corrected_groups": sum(r["external_corrected"] for r in rows),
        "uncorrected_groups": sum(r["external_uncorrected"] for r in rows),
        "no_success": sum(r["external_no_success"] for r in rows),
        "weight": [r["correction_weight"] for r in rows if r["corrected"]],
        "filtered": sum(r["filtered"] for r in rows),
        "corrected": sum(r["corrected"] for r in rows),
        "seconds": time.monotonic() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--model", default="tiny-mini")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--sets", default="plain,token,token+filter,gate+zone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    initial = load_model(NodeConfig(model=args.model, device="cpu").resolved())
    print(f"{args.nodes} nodes of {args.model} x {args.rounds} rounds, I/J 2/2, B 4, G 8, 16 tokens, lr {args.lr}")
    print("set seed reward external_kept with_logprobs without no_success weight_mean filtered/corrected s load")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in args.sets.split(","):
                r = run(name, seed, args, initial, Path(tmp))
                weight = sum(r["weight"]) / len(r["weight"]) if r["weight"] else float("nan")
                print(
                    f"{name} {seed} {r['reward']:.2f} {r['external_kept']} {r['corrected_groups']} "
                    f"{r['uncorrected_groups']} {r['no_success']} {weight:.3f} {r['filtered']}/{r['corrected']} "
                    f"{r['seconds']:.0f} {os.getloadavg()[0]:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
