"""An audit's upload as the whole checkpoint or as its difference from the model's base: bytes, and
CPU-seconds to make and to reconstruct.

    .venv/bin/python bench/audit_diff.py --models tiny-mini,tiny
    .venv/bin/python bench/audit_diff.py --models smollm2-135m --steps 3 --groups 2 --generations 4 --max-new-tokens 16

Per model it loads the base (sapo_node.commitments.base_tensors: float32, from --cache, as the node's
store and the audit worker load it), trains a copy with the node's own update (sapo_node.grpo:
grpo_update with AdamW at --lr, weight decay 0 as NodeConfig's default) for --steps rounds of
--groups groups of --generations seeded completions of up to --max-new-tokens tokens with rewards
alternating 1 and 0, and commits its weights (model_tensors, in --dtype). Then, --repeats times,
alternating which goes first, it makes the upload both ways (the node: safetensors.save_file, or
weightdiff.write_diff from the base in memory) and reconstructs it (the worker: safetensors load_file
or weightdiff.read_diff, then the weights digest both check), one torch thread, process time. The base's
own load (once per audit on the node, once per worker process on the site) is printed apart. The load
average is printed beside each repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchkit import load, use_checkout

use_checkout()

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from sapo_node import proof, weightdiff  # noqa: E402
from sapo_node.commitments import base_tensors, model_tensors, tensors_digest  # noqa: E402
from sapo_node.generate import generate_groups  # noqa: E402
from sapo_node.groups import TrainGroup  # noqa: E402
from sapo_node.grpo import grpo_update, make_optimizer  # noqa: E402
from sapo_node.models import load_policy  # noqa: E402
from sapo_node.prompts import format_prompt  # noqa: E402


def cpu(fn, *args, **kwargs):
    started = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - started


def train(name: str, args: argparse.Namespace) -> tuple[dict, float]:
    """The committed tensors after args.steps of the node's update, and the CPU-seconds they took."""
    started = time.process_time()
    policy, tokenizer, _ = load_policy(name, device="cpu", cache_dir=Path(args.cache), dtype=torch.float32)
    optimizer = make_optimizer(policy, lr=args.lr, weight_decay=0.0)
    for step in range(args.steps):
        questions = [f"What is {3 * step + i} + {7 * i + 2}?" for i in range(args.groups)]
        prompts = [format_prompt(tokenizer, q) for q in questions]
        keys = [
            [proof.completion_key("c1.bench.diff", "basic_arithmetic", step, i, k) for k in range(args.generations)]
            for i in range(args.groups)
        ]
        made = generate_groups(
            policy,
            tokenizer,
            prompts,
            generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            temperature=1.0,
            keys=keys,
        )
        groups = [
            TrainGroup(
                f"g{step}-{i}",
                "local",
                g.prompt_ids,
                [list(c) for c in g.completion_ids],
                [float(k % 2 == 0) for k in range(args.generations)],
            )
            for i, g in enumerate(made)
        ]
        stats = grpo_update(policy, optimizer, groups, pad_id=tokenizer.pad_token_id)
        print(
            f"  {name} step {step + 1}: loss {stats.loss:+.4f}, grad norm {stats.grad_norm:.3f}, {stats.tokens} tokens"
        )
    tensors = {k: v.to(getattr(torch, args.dtype)).clone() for k, v in model_tensors(policy).items()}
    return tensors, time.process_time() - started


def measure(name: str, args: argparse.Namespace) -> None:
    (base_digest, base), base_cpu = cpu(base_tensors, name, cache_dir=Path(args.cache))
    tensors, train_cpu = train(name, args)
    digest = tensors_digest(tensors)
    raw = sum(t.numel() * t.element_size() for t in tensors.values())
    changed = sum(int((t.to(torch.float32) != base[k].to(t.dtype).to(torch.float32)).sum()) for k, t in tensors.items())
    numel = sum(t.numel() for t in tensors.values())
    print(
        f"{name}: {numel:,} weights ({args.dtype}, {raw / 1e6:.1f} MB), {changed / numel:.1%} changed after "
        f"{args.steps} steps at lr {args.lr} ({train_cpu:.1f} CPU-s); base loaded in {base_cpu:.2f} CPU-s"
    )
    times: dict[str, list[float]] = {k: [] for k in ("make full", "make diff", "rebuild full", "rebuild diff")}
    sizes = {}
    with tempfile.TemporaryDirectory() as folder:
        full, diff = Path(folder) / "c.safetensors", Path(folder) / "c.sapodiff"

        def run_full() -> None:
            _, s = cpu(save_file, tensors, str(full))
            times["make full"].append(s)
            back, s = cpu(lambda: tensors_digest(load_file(str(full))))
            times["rebuild full"].append(s)
            assert back == digest
            sizes["full"] = full.stat().st_size

        def run_diff() -> None:
            _, s = cpu(weightdiff.write_diff, diff, tensors, base, model=name, base_digest=base_digest, weights=digest)
            times["make diff"].append(s)
            back, s = cpu(
                lambda: tensors_digest(weightdiff.read_diff(diff, base, base_digest=base_digest, max_bytes=1 << 31))
            )
            times["rebuild diff"].append(s)
            assert back == digest, "the difference did not reconstruct the committed weights"
            sizes["diff"] = diff.stat().st_size

        for r in range(args.repeats):
            for run in (run_full, run_diff) if r % 2 == 0 else (run_diff, run_full):
                run()
            print(f"  repeat {r + 1}: load {load()}")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{name}: upload {sizes['full'] / 1e6:.1f} MB whole, {sizes['diff'] / 1e6:.1f} MB as a difference "
        f"({sizes['diff'] / sizes['full']:.1%}); CPU-s (median of {args.repeats}) to make {med['make full']:.3f} "
        f"whole / {med['make diff']:.3f} diff, to reconstruct and check {med['rebuild full']:.3f} whole / "
        f"{med['rebuild diff']:.3f} diff; load {load()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-mini,tiny")
    parser.add_argument("--steps", type=int, default=3, help="Updates (rounds) before the weights are committed.")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--cache", default=os.environ.get("SAPO_AUDIT_MODEL_CACHE") or "var/test-cache")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"load average before: {load()}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        measure(name, args)


if __name__ == "__main__":
    main()
