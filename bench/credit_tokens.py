"""What a credit per generated token would pay, against the credit rule's verified reward, per CPU-second
of generation (docs/figures.md, "What a credited group is worth").

    .venv/bin/python bench/credit_tokens.py                      # tiny-mini, caps 32 and 256
    .venv/bin/python bench/credit_tokens.py --model tiny --rounds 2

For each max-new-tokens cap it generates --rounds rounds of B questions x G completions of the easy
catalogue (the node's sampler, temperature 1, one torch thread), scores them with the node's own
scorer (the verifier's rule), and prints per CPU-second of generation: the verified reward (what the
credit rule counts) and the tokens generated. Then the same with the model's stop tokens taken away:
a stand-in for weights trained never to stop, which an audit passes (the tokens are its weights' own
draws) and which fill every completion to the cap. The load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import time

from benchkit import load, use_checkout

use_checkout()

import torch  # noqa: E402

from sapo_node.generate import generate_groups  # noqa: E402
from sapo_node.models import load_policy  # noqa: E402
from sapo_node.prompts import format_prompt  # noqa: E402
from sapo_node.tasks import CATALOGUES, build_entry, score_completion  # noqa: E402


def measure(model, tokenizer, *, cap: int, rounds: int, questions: int, generations: int) -> dict[str, float]:
    catalogue = CATALOGUES["easy"]
    reward = tokens = cpu = 0.0
    completions = 0
    for r in range(rounds):
        specs = [catalogue.tasks[(r * questions + i) % len(catalogue.tasks)] for i in range(questions)]
        entries = [build_entry(spec, 1000 + r, i) for i, spec in enumerate(specs)]
        started = time.process_time()
        made = generate_groups(
            model,
            tokenizer,
            [format_prompt(tokenizer, e["question"]) for e in entries],
            generations=generations,
            max_new_tokens=cap,
            temperature=1.0,
        )
        cpu += time.process_time() - started
        for spec, entry, group in zip(specs, entries, made, strict=True):
            for text, ids in zip(group.texts, group.completion_ids, strict=True):
                reward += score_completion(spec, 1000 + r, entry, text)
                tokens += len(ids)
                completions += 1
    return {"reward": reward, "tokens": tokens, "cpu": cpu, "completions": completions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-mini")
    parser.add_argument("--caps", default="32,256", help="max-new-tokens caps, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=8, help="B")
    parser.add_argument("--generations", type=int, default=8, help="G")
    parser.add_argument("--cache", default="var/test-cache")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer, _ = load_policy(args.model, device="cpu", cache_dir=args.cache, dtype=torch.float32)
    print(f"load average before: {load()}")
    for stops in (True, False):
        if not stops:  # weights that never stop: no stop token ends a completion
            tokenizer.eos_token_id = None
            model.generation_config.eos_token_id = None
        for cap in [int(c) for c in args.caps.split(",")]:
            m = measure(
                model, tokenizer, cap=cap, rounds=args.rounds, questions=args.questions, generations=args.generations
            )
            print(
                f"{args.model} cap {cap} {'stops' if stops else 'never stops'}: {m['completions']} completions, "
                f"{m['tokens'] / m['completions']:.1f} tokens each, reward {m['reward'] / m['completions']:.3f} each; "
                f"per generation CPU-s: reward {m['reward'] / m['cpu']:.2f}, tokens {m['tokens'] / m['cpu']:.0f} "
                f"[load {load()}]"
            )


if __name__ == "__main__":
    main()
