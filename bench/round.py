"""Seconds per round and peak memory of a node round, sapo-node's way beside the incumbent demo's.

    .venv/bin/python bench/round.py                      # tiny model, B=8, G=8, 3 timed rounds each
    .venv/bin/python bench/round.py --model tiny-mini --rounds 5

Both variants run the same round (sample B questions -> G completions each -> score -> GRPO update
on the B own groups) on the same model and questions, in the same invocation:
  sapo-node   all B*G completions in one batched generate call (left padding), the model's default
              dtype (float32 on CPU, bfloat16 on CUDA);
  incumbent   one generate call per completion, float32, as the public demo does.
The update is sapo-node's for both (the demo's hand-written GRPO is not reproduced), so the gap is
the generation strategy and dtype.

Peak memory: tracemalloc only sees Python's allocator, not torch's tensors, so each variant runs in
its own subprocess and reports its peak resident set (getrusage ru_maxrss: model, activations,
Python and the libraries together); on CUDA it also reports torch.cuda.max_memory_allocated.
One warm-up round (kernel and allocator warm-up) is run before the timed ones and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("sapo-node", "incumbent")


def one_round(variant: str, model, tokenizer, stream, args) -> dict[str, float]:
    import torch

    from sapo_node.assemble import assemble
    from sapo_node.generate import Generated, generate_completions, pad_id
    from sapo_node.grpo import grpo_update
    from sapo_node.prompts import format_prompt
    from sapo_node.sample import sample_questions
    from sapo_node.score import score_rollouts

    t0 = time.perf_counter()
    questions = sample_questions(stream, args.questions)
    prompts = [format_prompt(tokenizer, q.question) for q in questions]
    kwargs = {"max_new_tokens": args.max_new_tokens, "temperature": 1.0}
    if variant == "sapo-node":
        generated = generate_completions(model, tokenizer, prompts, generations=args.generations, **kwargs)
    else:  # the incumbent: one generate call per completion
        generated = []
        for prompt in prompts:
            singles = [
                generate_completions(model, tokenizer, [prompt], generations=1, **kwargs)[0]
                for _ in range(args.generations)
            ]
            generated.append(
                Generated(
                    singles[0].prompt_ids,
                    [s.completion_ids[0] for s in singles],
                    [s.texts[0] for s in singles],
                    [s.truncated[0] for s in singles],
                )
            )
    t1 = time.perf_counter()
    own = score_rollouts(1, questions, generated)
    train, _ = assemble(
        own, [], n_local=len(own), n_external=0, rng=random.Random(0), catalogue=stream.catalogue,
        tokenizer=tokenizer, format_prompt=format_prompt, max_tokens=2 * args.max_new_tokens,
    )  # fmt: skip
    optimizer = args.optimizer
    t2 = time.perf_counter()
    stats = grpo_update(model, optimizer, train, pad_id=pad_id(tokenizer), micro_batch=16)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t3 = time.perf_counter()
    return {
        "total": t3 - t0,
        "generate": t1 - t0,
        "update": t3 - t2,
        "tokens": float(sum(g.num_tokens for g in generated)),
        "reward": statistics.fmean(r for g, _ in own for r in g.rewards),
        "groups": float(stats.sequences // args.generations),
    }


def child(args: argparse.Namespace) -> None:
    import torch

    from sapo_node.models import load_policy
    from sapo_node.tasks import CATALOGUES, TaskStream

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = "float32" if args.variant == "incumbent" else None
    model, tokenizer, device = load_policy(args.model, device=args.device, dtype=dtype)
    args.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    random.seed(0)
    torch.manual_seed(0)
    stream = TaskStream(CATALOGUES[args.catalogue], seed=0)
    one_round(args.variant, model, tokenizer, stream, args)  # warm-up
    rounds = [one_round(args.variant, model, tokenizer, stream, args) for _ in range(args.rounds)]
    result = {key: statistics.fmean(r[key] for r in rounds) for key in rounds[0]}
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
    result["device"] = device
    result["threads"] = torch.get_num_threads()
    result["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--catalogue", default="easy", choices=["easy", "sapo"])
    parser.add_argument("--questions", type=int, default=8, help="B")
    parser.add_argument("--generations", type=int, default=8, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per variant (after one warm-up)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return child(args)

    load_before = os.getloadavg()[0]  # the CPU is shared: say how busy it was
    results = {}
    for variant in VARIANTS:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant]
        cmd += ["--model", args.model, "--device", args.device, "--catalogue", args.catalogue]
        cmd += ["--questions", str(args.questions), "--generations", str(args.generations)]
        cmd += [
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--rounds",
            str(args.rounds),
            "--threads",
            str(args.threads),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{variant} failed:\n{done.stderr[-3000:]}")
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])

    ours, theirs = results["sapo-node"], results["incumbent"]
    print(f"model {args.model}, B={args.questions}, G={args.generations}, max_new_tokens={args.max_new_tokens}, "
          f"{args.rounds} timed rounds (+1 warm-up) each, device {ours['device']}, torch threads {ours['threads']}, "
          f"load average at start {load_before:.1f}")  # fmt: skip
    header = f"| {'variant':<10} | dtype    | s/round | generate s | update s | gen tokens/s | peak RSS MiB | CUDA peak MiB |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, r in results.items():
        cuda = f"{r['cuda_peak_mib']:.0f}" if r["cuda_peak_mib"] is not None else "-"
        print(
            f"| {name:<10} | {r['dtype']:<8} | {r['total']:7.2f} | {r['generate']:10.2f} | {r['update']:8.2f} | "
            f"{r['tokens'] / r['generate']:12.0f} | {r['peak_rss_mib']:12.0f} | {cuda:>13} |"
        )
    print(
        f"speed-up per round: {theirs['total'] / ours['total']:.1f}x (generation {theirs['generate'] / ours['generate']:.1f}x)"
    )


if __name__ == "__main__":
    main()
