"""What one audit job costs the worker, start to end, and what audits cost a swarm of 1,000 nodes.

    .venv/bin/python bench/audit_job.py                       # tiny-mini and tiny
    .venv/bin/python bench/audit_job.py --models tiny-mini --audits 5
    .venv/bin/python bench/audit_job.py --models smollm2-135m --compare-batch   # groups one pass each vs together

Per model it generates honest groups under a random challenge (sapo_node.generate, the node's seeded
sampler: --generations completions of up to --max-new-tokens tokens, temperature 1), writes the
weights as the node commits them (a safetensors file), then runs the audit job's own steps
(audits.replay, as audits.jobs.audit_run calls them, without the database): the file's sha256, its
parse and weights digest, the model rebuilt from the site's copy with the uploaded weights, and the
replay of SAPO_AUDIT_GROUPS groups. It prints the CPU-seconds (process time, one torch thread, as a
worker runs) of each step, of a whole job and per audited group, and what the default rates cost per
1,000 nodes: each node's weights change every round, so a node draws once per round, audited with
probability SAPO_AUDIT_RATE (0.05) or 4x that when boosted (--boosted, the share of nodes boosted),
plus its first digest once. The load average is printed beside the figures.

--compare-batch replays each job's groups twice, alternating which goes first: one pass per group,
and the worker's way (audits.replay.REPLAY_BATCH_ROWS completions a pass, the prompts' common prefix
once), and prints both CPU-seconds per group and their ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import tempfile
import time
from pathlib import Path

from benchkit import load, use_checkout

use_checkout()

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from audits import replay  # noqa: E402
from sapo_node import proof  # noqa: E402
from sapo_node.commitments import model_tensors, tensors_digest  # noqa: E402
from sapo_node.generate import generate_groups  # noqa: E402
from sapo_node.models import load_policy  # noqa: E402
from sapo_node.prompts import format_prompt  # noqa: E402

QUESTIONS = [f"What is {a} + {b}?" for a, b in zip(range(3, 40, 3), range(5, 60, 5), strict=False)]


def cpu(fn, *args, **kwargs):
    started = time.process_time()
    out = fn(*args, **kwargs)
    return out, time.process_time() - started


def replay_cpu(model, tok, to_replay, *, batch_rows: int) -> tuple[replay.ReplayReport, float]:
    default, replay.REPLAY_BATCH_ROWS = replay.REPLAY_BATCH_ROWS, batch_rows
    try:
        return cpu(replay.replay_groups, model, tok, to_replay, max_tokens=1 << 20)
    finally:
        replay.REPLAY_BATCH_ROWS = default


def measure(
    model_name: str, *, audits: int, groups: int, generations: int, tokens: int, cache: Path, compare: bool
) -> dict:
    policy, tokenizer, _ = load_policy(model_name, device="cpu", cache_dir=cache, dtype=torch.float32)
    challenge = "c1.bench." + secrets.token_hex(8)
    steps: dict[str, float] = {"sha256+parse+digest": 0.0, "model": 0.0, "replay": 0.0}
    one_by_one = 0.0
    replayed = replayed_tokens = 0
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "upload.safetensors"
        tensors = model_tensors(policy)
        digest = tensors_digest(tensors)
        save_file(tensors, str(path))
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        for a in range(audits):
            picked = [QUESTIONS[(a * groups + i) % len(QUESTIONS)] for i in range(groups)]
            keys = [
                [proof.completion_key(challenge, "basic_arithmetic", a, i, k) for k in range(generations)]
                for i in range(groups)
            ]
            made = generate_groups(
                policy,
                tokenizer,
                [format_prompt(tokenizer, q) for q in picked],
                generations=generations,
                max_new_tokens=tokens,
                temperature=1.0,
                keys=keys,
            )
            to_replay = [
                replay.GroupToReplay(
                    f"g{a}-{i}",
                    "basic_arithmetic",
                    a,
                    i,
                    q,
                    g.texts,
                    {
                        "challenge": challenge,
                        "temperature": 1.0,
                        "tokens": [proof.encode_ids(c) for c in g.completion_ids],
                        "logprobs": [proof.encode_floats(lp) for lp in g.logprobs],
                    },
                )
                for i, (q, g) in enumerate(zip(picked, made, strict=True))
            ]
            loaded, seconds = cpu(replay.load_checkpoint, path, sha256=sha, weights=digest)
            steps["sha256+parse+digest"] += seconds
            (model, tok), seconds = cpu(replay.load_model, model_name, loaded, cache_dir=cache)
            steps["model"] += seconds
            if compare and a % 2 == 0:  # alternating: neither way always runs warm
                _, one_by_one_seconds = replay_cpu(model, tok, to_replay, batch_rows=1)
            report, seconds = replay_cpu(model, tok, to_replay, batch_rows=replay.REPLAY_BATCH_ROWS)
            if compare and a % 2 == 1:
                _, one_by_one_seconds = replay_cpu(model, tok, to_replay, batch_rows=1)
            if compare:
                one_by_one += one_by_one_seconds
            steps["replay"] += seconds
            replayed += report.groups
            replayed_tokens += report.tokens
    job = sum(steps.values()) / audits
    return {
        "steps": {k: v / audits for k, v in steps.items()},
        "job": job,
        "per_group": steps["replay"] / replayed,
        "tokens_per_group": replayed_tokens / replayed,
        "file_mb": path_size_mb(tensors),
        "per_group_one_by_one": one_by_one / replayed if compare else None,
    }


def path_size_mb(tensors: dict) -> float:
    return sum(t.numel() * t.element_size() for t in tensors.values()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-mini,tiny")
    parser.add_argument("--audits", type=int, default=3, help="Jobs measured per model.")
    parser.add_argument("--groups", type=int, default=4, help="Groups a job replays (SAPO_AUDIT_GROUPS).")
    parser.add_argument("--generations", type=int, default=8, help="Completions per group (G).")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds-per-hour", type=float, default=30.0, help="Rounds a node plays per hour.")
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--boosted", type=float, default=0.1, help="Share of nodes drawn at 4x the rate.")
    parser.add_argument(
        "--compare-batch", action="store_true", help="also replay each job's groups one pass per group, alternating"
    )
    parser.add_argument("--cache", default=os.environ.get("SAPO_AUDIT_MODEL_CACHE") or "var/test-cache")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {load()}")
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        m = measure(
            name,
            audits=args.audits,
            groups=args.groups,
            generations=args.generations,
            tokens=args.max_new_tokens,
            cache=Path(args.cache),
            compare=args.compare_batch,
        )
        rate = args.rate * (1 - args.boosted) + min(1.0, 4 * args.rate) * args.boosted
        audits_per_hour = 1000 * args.rounds_per_hour * rate
        steps = ", ".join(f"{k} {v:.2f}" for k, v in m["steps"].items())
        print(
            f"{name}: checkpoint {m['file_mb']:.1f} MB; one job {m['job']:.2f} CPU-s ({steps}); "
            f"{m['per_group']:.3f} CPU-s per audited group of {args.generations} x {m['tokens_per_group'] / args.generations:.0f} tokens; "
            f"1,000 nodes at {args.rounds_per_hour:g} rounds/h, rate {args.rate} ({args.boosted:.0%} boosted x4): "
            f"{audits_per_hour:.0f} audits/h, {audits_per_hour * m['job'] / 3600:.2f} worker cores  [load {load()}]"
        )
        if m["per_group_one_by_one"] is not None:
            print(
                f"{name}: replay CPU-s per group, one pass per group {m['per_group_one_by_one']:.3f}, "
                f"{args.groups} groups in a pass {m['per_group']:.3f} "
                f"({m['per_group_one_by_one'] / m['per_group']:.2f}x)  [load {load()}]"
            )


if __name__ == "__main__":
    main()
