"""`python -m sapo_node.tiny`: build or load a built-in model, print what its build measured and,
with --eval, its accuracy on held-out questions.

    python -m sapo_node.tiny --variant tiny --eval

Its generation speed is measured by bench/round.py (--paths: completions of a fixed length).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sapo_node.tiny.cache import build_info, load_tiny, tiny_path
from sapo_node.tiny.evaluation import EVAL_SEED, evaluate
from sapo_node.tiny.variants import VARIANTS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sapo_node.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="tiny", choices=sorted(VARIANTS))
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $SAPO_CACHE or ~/.cache/sapo-node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="warm-start steps (default: the variant's)")
    parser.add_argument("--eval", action="store_true", help="print per-dataset accuracy on held-out questions")
    parser.add_argument("-n", type=int, default=64, help="questions per dataset for --eval")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --eval")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: OMP_NUM_THREADS, else the cores no other process is using, as the node)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be at least 1")

    import torch

    from sapo_node.machine import choose_threads, read_machine

    # As the node (sapo_node.machine.choose_threads): on a machine already at work, a thread on every core
    # spin-waits against that work, and a warm start runs several times slower than on the idle cores.
    torch.set_num_threads(args.threads or choose_threads(read_machine("cpu")))
    started = time.perf_counter()
    model, tokenizer = load_tiny(args.variant, args.cache_dir, args.seed, args.steps)
    path = tiny_path(args.variant, args.cache_dir, args.seed, args.steps)
    info = build_info(path) or {}
    print(
        f"{args.variant}: {path} (loaded in {time.perf_counter() - started:.1f} s on {torch.get_num_threads()} threads)"
    )
    print(
        f"  params {info.get('params')}, vocab {info.get('vocab_size')}, tokenizer {info.get('tokenizer_seconds')} s, "
        f"warm start {info.get('warm_start_seconds')} s on {info.get('torch_threads')} threads, "
        f"final loss {info.get('final_loss')}"
    )
    if args.eval:
        greedy = evaluate(model, tokenizer, n=args.n)
        sampled = evaluate(model, tokenizer, n=args.n, temperature=args.temperature)
        print(f"\n{'dataset':<26}{'greedy':>8}{f'T={args.temperature:g}':>8}   (n={args.n}, seed {EVAL_SEED})")
        for name in greedy:
            print(f"{name:<26}{greedy[name]:>8.1%}{sampled[name]:>8.1%}")
        mean = sum(greedy.values()) / len(greedy), sum(sampled.values()) / len(sampled)
        print(f"{'mean':<26}{mean[0]:>8.1%}{mean[1]:>8.1%}")
