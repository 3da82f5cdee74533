"""What committing to a round's weights costs a node (sapo_node.commitments): the digest of the
state_dict, and the safetensors file written, fsynced and renamed into the run folder, per model.

    SAPO_CACHE=var/test-cache .venv/bin/python bench/commitments.py [--models tiny-mini,smollm2-135m] [--rounds 5]

Each timed round changes one weight (as an update does) so the file is written anew; it prints the
median seconds of the digest and of the whole commit, the file's size, and its ratio to the model's
round time (docs/benchmarks.md, "Node round"). Then what a round pays with the commit overlapping its
generation, as the loop runs them: generation of the round bench's shape alone, and generation with
the commit begun before it and waited for after, alternating (A B, B A, ...); the extra seconds are
the commit's cost to the round."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import use_checkout  # noqa: E402

use_checkout()

import torch  # noqa: E402

from sapo_node.commitments import CommitmentStore, model_tensors, tensors_digest  # noqa: E402
from sapo_node.generate import generate_groups  # noqa: E402
from sapo_node.models import load_policy  # noqa: E402
from sapo_node.prompts import format_prompt  # noqa: E402
from sapo_node.sample import sample_questions  # noqa: E402
from sapo_node.tasks import CATALOGUES, TaskStream  # noqa: E402

#: Seconds per round of each model on this kind of machine (docs/benchmarks.md, "Node round", 2 threads).
ROUND_SECONDS = {"tiny-mini": 0.213, "tiny": 0.399, "smollm2-135m": 5.738}
#: The round bench's shape per model: questions, generations, new tokens.
SHAPE = {"tiny-mini": (8, 8, 48), "tiny": (8, 8, 48), "smollm2-135m": (4, 4, 32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny-mini,smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start", flush=True)
    for name in args.models.split(","):
        model, tokenizer, _ = load_policy(name, device="cpu", dtype=getattr(torch, args.dtype))
        with tempfile.TemporaryDirectory(dir=os.environ.get("SAPO_BENCH_DIR")) as folder:
            store = CommitmentStore(folder)
            digests, commits, size = [], [], 0
            first = next(model.parameters())
            for _ in range(args.rounds + 1):  # the first is a warm-up
                with torch.no_grad():
                    first.view(-1)[0] += 1e-3
                started = time.perf_counter()
                tensors_digest(model_tensors(model))
                digests.append(time.perf_counter() - started)
                c = store.commit(model)  # keeps nothing else: the previous file is deleted, as when acked
                assert c is not None and c.written
                commits.append(c.seconds)
                size = c.bytes
            digest_s, commit_s = statistics.median(digests[1:]), statistics.median(commits[1:])
            ratio = commit_s / ROUND_SECONDS[name] if name in ROUND_SECONDS else float("nan")
            print(
                f"{name} ({args.dtype}): file {size / 1e6:.1f} MB; digest {digest_s:.3f} s, commit (digest + file) "
                f"{commit_s:.3f} s median of {args.rounds}; commit / round {ratio:.2f} "
                f"(round {ROUND_SECONDS.get(name, float('nan'))} s); load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
            b, g, tokens = SHAPE.get(name, (4, 4, 32))
            prompts = [
                format_prompt(tokenizer, q.question) for q in sample_questions(TaskStream(CATALOGUES["easy"], 0), b)
            ]

            alone, overlapped = [], []
            for i in range(2 * args.rounds):
                with torch.no_grad():
                    first.view(-1)[0] += 1e-3
                for with_commit in (False, True) if i % 2 == 0 else (True, False):
                    started = time.perf_counter()
                    pending = store.begin(model) if with_commit else None
                    generate_groups(model, tokenizer, prompts, generations=g, max_new_tokens=tokens, temperature=1.0)
                    if pending is not None:
                        assert pending.result() is not None
                    (overlapped if with_commit else alone).append(time.perf_counter() - started)
            gen_s, both_s = statistics.median(alone), statistics.median(overlapped)
            print(
                f"{name}: generation (B={b}, G={g}, {tokens} tokens) {gen_s:.3f} s, with the commit overlapping it "
                f"{both_s:.3f} s: +{both_s - gen_s:.3f} s a round, {(both_s - gen_s) / ROUND_SECONDS.get(name, 1):.2f} "
                f"of a round; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
