"""What a node learns: train one offline (silo) node, then compare the policy before and after on
held-out questions, per dataset: the verifier's score, the share of answers given in <answer> tags,
and the score when an untagged answer is read as the answer (what the model knows, any format).

    python -m research.learned --model tiny-learn --seed 1 --rounds 80

(docs/experiment.md, "What the nodes learn", was measured with these defaults.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
from typing import Any

import torch

from research.presets import LEARN_LR
from sapo_node.config import NodeConfig
from sapo_node.loop import run
from sapo_node.models import load_policy
from sapo_node.tasks import EASY_CATALOGUE, extract_answer, score_completion
from sapo_node.tiny.evaluation import EVAL_SEED, heldout_answers


def format_report(model: Any, tokenizer: Any, *, n: int, temperature: float, max_new_tokens: int) -> dict[str, tuple]:
    """{dataset: (score, tagged share, score reading untagged text as the answer)} on held-out questions."""
    torch.manual_seed(0)
    out = {}
    for spec in EASY_CATALOGUE.tasks:
        entries, texts = heldout_answers(
            model, tokenizer, spec, n=n, temperature=temperature, max_new_tokens=max_new_tokens
        )
        tagged = [extract_answer(t) is not None for t in texts]
        score = [score_completion(spec, EVAL_SEED, e, t) for e, t in zip(entries, texts, strict=True)]
        as_answer = [t if ok else f"<answer>{t.strip()}</answer>" for t, ok in zip(texts, tagged, strict=True)]
        knows = [score_completion(spec, EVAL_SEED, e, t) for e, t in zip(entries, as_answer, strict=True)]
        out[spec.dataset] = (sum(score) / n, sum(tagged) / n, sum(knows) / n)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m research.learned", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-learn")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--lr", type=float, default=LEARN_LR)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("-n", type=int, default=48, help="held-out questions per dataset")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    model, tokenizer, _ = load_policy(args.model, device="cpu")
    settings = {"n": args.n, "max_new_tokens": args.max_new_tokens}
    before = {t: format_report(model, tokenizer, temperature=t, **settings) for t in (0.0, 1.0)}
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        config = NodeConfig(
            offline=True,
            model=args.model,
            out=out,
            seed=args.seed,
            rounds=args.rounds,
            questions=4,
            generations=8,
            local=4,
            external=0,
            max_new_tokens=args.max_new_tokens,
            lr=args.lr,
            checkpoint_every=0,
            threads=args.threads,
        )
        run(config, policy=(model, tokenizer))  # trains `model` in place
    after = {t: format_report(model, tokenizer, temperature=t, **settings) for t in (0.0, 1.0)}
    print(f"{args.model}, silo, seed {args.seed}, {args.rounds} rounds, lr {args.lr:g}; load {os.getloadavg()[0]:.1f}")
    print("dataset: score / tagged / knows, greedy before -> after | T=1 before -> after")
    for name in before[0.0]:
        cells = [" / ".join(f"{x:.2f}" for x in d[t][name]) for t in (0.0, 1.0) for d in (before, after)]
        print(f"{name:<26} {cells[0]} -> {cells[1]} | {cells[2]} -> {cells[3]}")


if __name__ == "__main__":
    main()
