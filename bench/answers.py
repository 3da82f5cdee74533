"""How often a model's answers are parsed and right: per dataset of a catalogue, greedy, with the
node's prompt (system message and worked turns) and without its worked turns.

    .venv/bin/python bench/answers.py --model smollm2-135m --catalogue easy -n 200
    .venv/bin/python bench/answers.py --model smollm2-135m --catalogue sapo -n 200 --max-new-tokens 96

Questions 0..n-1 of the held-out dataset seed (sapo_node.tiny.evaluation.EVAL_SEED), generated in batches with
the export's evaluation code (sapo_node.tiny.evaluation.heldout_answers) and scored by the one rule node and
server share (sapo_node.tasks.score_completion). `parsed` = the share of completions with an
<answer>...</answer>; `accuracy` = the mean score. `bare` = the share of completions without tags
whose last line (after its last "=") the verifier would score above 0: what a tolerant extraction
would add (not what the node scores). Each dataset's row is appended to --out as it finishes, with the
load average beside it (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from sapo_node.models import load_policy
from sapo_node.tasks import CATALOGUES, extract_answer, score_completion
from sapo_node.tiny.evaluation import EVAL_SEED, heldout_answers


def last_line_answer(completion: str) -> str:
    """What a tolerant reading would take from a completion without tags (measured, not used)."""
    lines = [line.strip() for line in completion.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return last.rsplit("=", 1)[-1].strip().rstrip(".")[:64]


def measure(model, tokenizer, spec, *, n: int, few_shot: bool, max_new_tokens: int, batch: int) -> dict:
    started = time.perf_counter()
    entries, completions = heldout_answers(
        model, tokenizer, spec, n=n, max_new_tokens=max_new_tokens, batch=batch, few_shot=few_shot
    )
    seconds = time.perf_counter() - started
    scores = [score_completion(spec, EVAL_SEED, e, c) for e, c in zip(entries, completions, strict=True)]
    untagged = [(e, c) for e, c in zip(entries, completions, strict=True) if extract_answer(c) is None]
    bare = [score_completion(spec, EVAL_SEED, e, f"<answer>{last_line_answer(c)}</answer>") > 0 for e, c in untagged]
    return {
        "dataset": spec.dataset,
        "few_shot": few_shot,
        "n": n,
        "parsed": round(1 - len(untagged) / n, 4),
        "accuracy": round(sum(scores) / n, 4),
        "bare": round(sum(bare) / n, 4),
        "seconds": round(seconds, 1),
        "load": round(os.getloadavg()[0], 2),
        "example": completions[0][:200],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--catalogue", default="easy", choices=sorted(CATALOGUES))
    parser.add_argument("--datasets", default="", help="comma-separated subset of the catalogue (default all)")
    parser.add_argument("-n", type=int, default=200, help="questions per dataset")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, default=25, help="prompts per generate call")
    parser.add_argument("--prompts", default="zero-shot,few-shot", help="which prompts, in this order")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/answers.jsonl"))
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_policy(args.model, device="cpu")
    wanted = [d for d in args.datasets.split(",") if d]
    specs = [s for s in CATALOGUES[args.catalogue].tasks if not wanted or s.dataset in wanted]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for spec in specs:
        for prompt in args.prompts.split(","):
            row = measure(
                model,
                tokenizer,
                spec,
                n=args.n,
                few_shot=prompt == "few-shot",
                max_new_tokens=args.max_new_tokens,
                batch=args.batch,
            )
            row = {"model": args.model, "catalogue": args.catalogue, "prompt": prompt, **row}
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(
                f"{spec.dataset:26s} {prompt:9s} parsed {row['parsed']:.3f} accuracy {row['accuracy']:.3f}"
                f" bare {row['bare']:.3f} ({row['seconds']} s, load {row['load']})",
                flush=True,
            )


if __name__ == "__main__":
    main()
