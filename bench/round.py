"""Seconds per round and peak memory of a node round: sapo-node's, the incumbent demo's, and TRL's.

    .venv/bin/python bench/round.py                          # tiny model, B=8, G=8: sapo-node vs incumbent
    .venv/bin/python bench/round.py --trl --no-incumbent     # sapo-node vs TRL's GRPOTrainer
    .venv/bin/python bench/round.py --trl --model tiny-mini --threads 2 --rounds 10
    .venv/bin/python bench/round.py --model smollm2-135m --questions 4 --generations 4 --max-new-tokens 32 \
        --micro-batch 8 --rounds 3 --no-incumbent --threads 2   # a real model: prints generate, score, update
    .venv/bin/python bench/round.py --paths --model small --catalogue sapo --device cuda --max-new-tokens 64

--prefix-paths times a round's generation (B x G completions of exactly --max-new-tokens tokens) and
its update's forward and backward passes (no optimizer step) with the prompts' shared beginning run
once (sapo_node.shared_prefix) and with each prompt run whole, alternating, after one warm-up each:

    .venv/bin/python bench/round.py --prefix-paths --model smollm2-135m --questions 4 --generations 4 \
        --max-new-tokens 32 --micro-batch 8 --rounds 5 --threads 2

--paths times generation alone, B x G completions of exactly --max-new-tokens tokens (stop tokens
ignored), on sapo_node.generate's two paths alternating: the dropping loop (the CPU's) and the static
path (the GPU's: fixed shapes, compiled decode step on CUDA, one sync); it prints s per batch and
tokens/s for each, after one warm-up call per path (on CUDA that call compiles and captures).

Every variant runs the same round (B questions -> G completions each -> score -> one GRPO optimizer
step) on the same model and questions, with the same max new tokens, temperature (plain sampling,
no top-k/top-p), learning rate, clipping and torch threads:
  sapo-node   sapo_node.generate + sapo_node.grpo as the node runs them (one update on the groups
              whose rewards differ; groups whose rewards all agree carry no signal and are dropped,
              unless --train-all, which trains on all B*G rows as TRL does);
  incumbent   one model.generate call per completion, float32, as the public demo does; then
              sapo-node's update (the demo's hand-written GRPO is not reproduced);
  trl         TRL's GRPOTrainer (requirements/bench-trl.txt) on the same model directory: loss_type
              "dapo", beta 0 (no reference model), epsilon 0.2 / epsilon_high 0.28 as sapo-node,
              num_generations G, per-device batch = --micro-batch and gradient accumulation so that
              one optimizer step is one round (B*G completions), transformers generate (no vLLM),
              no mixed precision and no gradient checkpointing (TRL's defaults turn both on; both
              cost time here); it trains on all B*G completions, zero-advantage ones included.

Each variant runs in its own long-lived subprocess (so each one's peak resident set is its own:
getrusage ru_maxrss of model, activations, Python and libraries; on CUDA also
torch.cuda.max_memory_allocated). After a one-off start (loading, and one warm-up round that is not
counted), the parent runs the timed rounds ALTERNATING between the variants (A B, B A, A B, ...), so
every variant sees the same machine load. TRL's start-up (trainer construction, its first step) is
reported apart and not counted in its s/round.

The CPU may be shared: the load average is printed at the start and the end, with the CPU time
other processes used during the timed rounds, and a ratio between variants is refused (warning,
exit status 3) when the load from other processes was above 1.5, unless --force.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "node_client")]  # measure this checkout's sapo_node, not an installed one

VARIANTS = ("sapo-node", "incumbent", "trl")
MARK = "@@bench "  # protocol lines on a child's stdout; libraries may print other lines there
MAX_QUIET_LOAD = 1.5


# --- children ------------------------------------------------------------------------------------


def say(message: dict) -> None:
    print(MARK + json.dumps(message), flush=True)


def command() -> str:
    return sys.stdin.readline().strip() or "stop"


def peak_memory(device: str) -> dict:
    import torch

    return {
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None,
    }


def hf_generate_one(model, tokenizer, prompt: str, args) -> tuple[list[int], list[int], str, bool]:
    """The incumbent's way: one model.generate call for one completion."""
    import torch

    from sapo_node.generate import encode_prompt, pad_id, stop_ids

    ids = encode_prompt(tokenizer, prompt)
    stops = stop_ids(model, tokenizer)
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor([ids], device=model.device),
            attention_mask=torch.ones((1, len(ids)), device=model.device, dtype=torch.long),
            do_sample=True,
            temperature=args.temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=args.max_new_tokens,
            pad_token_id=pad_id(tokenizer),
            eos_token_id=sorted(stops),
        )[0, len(ids) :].tolist()
    end = next((i + 1 for i, t in enumerate(out) if t in stops), None)
    completion = out[:end] if end else out
    text = tokenizer.decode([t for t in completion if t not in stops], skip_special_tokens=True)
    return ids, completion, text, end is None


def sapo_round(variant: str, model, tokenizer, optimizer, stream, args) -> dict:
    import torch

    from sapo_node.assemble import assemble, local_train_group
    from sapo_node.generate import Generated, generate_groups, pad_id
    from sapo_node.grpo import grpo_update
    from sapo_node.prompts import format_prompt
    from sapo_node.sample import sample_questions
    from sapo_node.score import score_rollouts

    t0 = time.perf_counter()
    questions = sample_questions(stream, args.questions)
    prompts = [format_prompt(tokenizer, q.question) for q in questions]
    if variant == "sapo-node":
        generated = generate_groups(
            model,
            tokenizer,
            prompts,
            generations=args.generations,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
        )
    else:
        generated = []
        for prompt in prompts:
            singles = [hf_generate_one(model, tokenizer, prompt, args) for _ in range(args.generations)]
            generated.append(
                Generated(singles[0][0], [s[1] for s in singles], [s[2] for s in singles], [s[3] for s in singles])
            )
    tg = time.perf_counter()
    own = score_rollouts(1, questions, generated)
    t1 = time.perf_counter()
    if args.train_all:  # as TRL does: every group, zero-advantage ones too (they add tokens, not gradient)
        train = [local_train_group(group, gen) for group, gen in own]
    else:
        train, _ = assemble(
            own,
            [],
            n_local=len(own),
            n_external=0,
            rng=random.Random(0),
            catalogue=stream.catalogue,
            tokenizer=tokenizer,
            format_prompt=format_prompt,
            max_tokens=2 * args.max_new_tokens,
        )
    grpo_update(
        model, optimizer, train, pad_id=pad_id(tokenizer), micro_batch=args.micro_batch, temperature=args.temperature
    )
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {
        "total": t2 - t0,
        "rollout": t1 - t0,
        "generate": tg - t0,
        "score": t1 - tg,
        "update": t2 - t1,
        "tokens": sum(g.num_tokens for g in generated),
        "reward": statistics.fmean(r for g, _ in own for r in g.rewards),
        "trained": sum(len(g.completion_ids) for g in train),
    }


def sapo_child(args: argparse.Namespace) -> None:
    import torch

    from sapo_node.grpo import make_optimizer
    from sapo_node.models import load_policy
    from sapo_node.tasks import CATALOGUES, TaskStream

    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = "float32" if args.variant == "incumbent" else None
    model, tokenizer, device = load_policy(args.model, device=args.device, cache_dir=args.cache_dir, dtype=dtype)
    optimizer = make_optimizer(model, lr=args.lr, weight_decay=0.01)
    random.seed(0)
    torch.manual_seed(0)
    stream = TaskStream(CATALOGUES[args.catalogue], seed=0)
    sapo_round(args.variant, model, tokenizer, optimizer, stream, args)  # warm-up
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    say({"ready": time.perf_counter() - started})
    while command() == "round":
        say(sapo_round(args.variant, model, tokenizer, optimizer, stream, args))
    say(
        {
            **peak_memory(device),
            "device": device,
            "threads": torch.get_num_threads(),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        }
    )


def trl_child(args: argparse.Namespace) -> None:
    """TRL's GRPOTrainer, held at the start of each optimizer step until the parent says "round"."""
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sapo_node.models import resolve_device, resolve_dtype
    from sapo_node.packaged import PACKAGED, ensure_converted
    from sapo_node.prompts import format_prompt
    from sapo_node.sample import sample_questions
    from sapo_node.tasks import CATALOGUES, TaskStream, score_completion
    from sapo_node.tiny.cache import build_info, tiny_path
    from sapo_node.tiny.variants import VARIANTS as TINY

    started = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    cache_dir = Path(args.cache_dir) if args.cache_dir else None
    if args.model in TINY:
        path = str(tiny_path(args.model, cache_dir))
    elif args.model in PACKAGED:  # the folder the node converted the packaged file into
        path = str(ensure_converted(args.model, cache_dir))
    else:
        path = args.model
    if args.model in TINY and build_info(Path(path)) is None:
        sys.exit(f"{path} is not built yet (the sapo-node variant builds it)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    # The same questions as sapo-node's child, round by round: its stream, seed 0, drawn in order.
    stream = TaskStream(CATALOGUES[args.catalogue], seed=0)
    questions = [q for _ in range(args.rounds + 2) for q in sample_questions(stream, args.questions)]
    dataset = Dataset.from_list(
        [{"prompt": format_prompt(tokenizer, q.question), "qid": i} for i, q in enumerate(questions)]
    )

    seen: list[int] = []  # question ids scored this step: checked against sapo-node's order

    def reward(prompts, completions, qid, **_) -> list[float]:  # noqa: ANN001  the verifier sapo-node scores with
        seen.extend(qid)
        return [
            score_completion(questions[i].spec, questions[i].ref.seed, questions[i].entry, c)
            for c, i in zip(completions, qid, strict=True)
        ]

    rows = args.questions * args.generations
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=10**6,
        seed=0,
        use_cpu=device == "cpu",
        bf16=False,
        fp16=False,
        model_init_kwargs={"dtype": str(resolve_dtype(device)).removeprefix("torch.")},
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=rows // args.micro_batch,
        num_generations=args.generations,
        max_completion_length=args.max_new_tokens,
        shuffle_dataset=False,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        num_iterations=1,
        loss_type="dapo",
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        scale_rewards="group",
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        max_steps=args.rounds + 2,
        dataloader_num_workers=0,
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=path, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer
    )

    step = {"rollout": 0.0, "tokens": 0}
    real = trainer._generate_and_score_completions

    def timed(*a, **k):  # noqa: ANN002, ANN003
        t = time.perf_counter()
        out = real(*a, **k)
        step["rollout"] += time.perf_counter() - t
        step["tokens"] += int(out["completion_mask"].sum())
        return out

    trainer._generate_and_score_completions = timed  # measured, not changed

    class Lockstep(TrainerCallback):
        """Reports the step that just ended, then waits for the parent before starting the next."""

        t0: float | None = None

        def on_step_begin(self, args_, state, control, **kwargs):  # noqa: ANN001, ANN003
            now = time.perf_counter()
            if self.t0 is None:  # the first step is TRL's warm-up: it is about to start
                self.t0 = now
                return
            first = (state.global_step - 1) * args.questions  # this step's questions are first .. first + B - 1
            if sorted(set(seen)) != list(range(first, first + args.questions)):
                sys.exit(f"TRL's step {state.global_step} scored questions {sorted(set(seen))}, not sapo-node's")
            seen.clear()
            if state.global_step == 1:
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                say({"ready": now - started})
            else:
                total = now - self.t0
                say(
                    {
                        "total": total,
                        "rollout": step["rollout"],
                        "update": total - step["rollout"],
                        "tokens": step["tokens"],
                        "trained": rows,
                        "threads": torch.get_num_threads(),
                    }
                )
            if command() != "round":
                say(
                    {
                        **peak_memory(device),
                        "device": device,
                        "threads": torch.get_num_threads(),
                        "dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
                    }
                )
                sys.stdout.flush()
                os._exit(0)  # mid-training: nothing of the trainer's needs saving
            step.update(rollout=0.0, tokens=0)
            self.t0 = time.perf_counter()

    trainer.add_callback(Lockstep())
    trainer.train()
    sys.exit("TRL ran out of steps before the parent stopped it")


# --- parent --------------------------------------------------------------------------------------


class Child:
    def __init__(self, variant: str, args: argparse.Namespace) -> None:
        self.variant = variant
        cmd = [sys.executable, str(Path(__file__).resolve()), "--variant", variant]
        for name in (
            "model",
            "device",
            "catalogue",
            "questions",
            "generations",
            "max_new_tokens",
            "temperature",
            "micro_batch",
            "lr",
            "rounds",
            "threads",
            "cache_dir",
        ):
            value = getattr(args, name)
            if value is not None:
                cmd += [f"--{name.replace('_', '-')}", str(value)]
        cmd += ["--train-all"] if args.train_all else []
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True)

    def read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        self.stderr.seek(0)
        sys.exit(f"{self.variant} failed (exit {self.proc.wait()}):\n{self.stderr.read()[-4000:]}")

    def send(self, text: str) -> dict:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.read()

    def cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, IndexError, ValueError):
            return 0.0


def busy_cpu_seconds() -> float | None:
    """CPU seconds all processes have used since boot (Linux /proc/stat), or None elsewhere."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def prebuild(args: argparse.Namespace) -> None:
    """Build a built-in model that is not in the cache yet, in a process of its own: built by the first
    child, its tokenizer training and warm start counted in that child's peak memory (939 against 586
    MiB for tiny) and start-up (103 s)."""
    from sapo_node.tiny.cache import build_info, tiny_path
    from sapo_node.tiny.variants import VARIANTS

    if args.model not in VARIANTS:
        return
    if build_info(tiny_path(args.model, Path(args.cache_dir) if args.cache_dir else None)) is not None:
        return
    print(f"building the built-in model {args.model!r} once (not timed) ...", file=sys.stderr, flush=True)
    code = (
        "import sys; from sapo_node.tiny.cache import load_tiny; load_tiny(sys.argv[1], cache_dir=sys.argv[2] or None)"
    )
    subprocess.run([sys.executable, "-c", code, args.model, args.cache_dir or ""], check=True)


def generation_paths(args: argparse.Namespace) -> None:
    import torch

    from sapo_node.generate import _sample_rows, _sample_rows_static, encode_prompt, pad_id
    from sapo_node.models import load_policy
    from sapo_node.prompts import format_prompt
    from sapo_node.sample import sample_questions
    from sapo_node.tasks import CATALOGUES, TaskStream

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, device = load_policy(args.model, device=args.device, cache_dir=args.cache_dir)
    model.eval()
    stream = TaskStream(CATALOGUES[args.catalogue], seed=0)
    prompt_ids = [
        encode_prompt(tokenizer, format_prompt(tokenizer, q.question)) for q in sample_questions(stream, args.questions)
    ]
    owners = [b for b in range(len(prompt_ids)) for _ in range(args.generations)]
    compile_mode = "reduce-overhead" if device.startswith("cuda") else None

    def timed(path: str) -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.inference_mode():
            if path == "static":
                rows, _ = _sample_rows_static(
                    model,
                    prompt_ids,
                    owners,
                    set(),
                    pad_id(tokenizer),
                    args.max_new_tokens,
                    args.temperature,
                    compile_mode,
                )
            else:
                rows, _ = _sample_rows(
                    model, prompt_ids, owners, set(), pad_id(tokenizer), args.max_new_tokens, args.temperature
                )
        assert all(len(r) == args.max_new_tokens for r in rows)  # returned as lists: synchronised
        return time.perf_counter() - started

    load_start = os.getloadavg()
    paths = ("loop", "static")
    warm = {p: timed(p) for p in paths}  # on CUDA the static path compiles and captures here
    seconds: dict[str, list[float]] = {p: [] for p in paths}
    for r in range(args.rounds):
        for p in paths if r % 2 == 0 else paths[::-1]:
            seconds[p].append(timed(p))
    tokens = len(owners) * args.max_new_tokens
    print(
        f"model {args.model} on {device} ({str(next(model.parameters()).dtype).removeprefix('torch.')}), "
        f"{args.questions} x {args.generations} rows x {args.max_new_tokens} tokens, {args.rounds} timed calls each, "
        f"alternating; load average at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    print("| path   | s per batch (median) | min s | tokens/s | ms per decode step | first call s |")
    print("|--------|----------------------|-------|----------|--------------------|--------------|")
    for p in paths:
        median = statistics.median(seconds[p])
        print(
            f"| {p:<6} | {median:20.3f} | {min(seconds[p]):5.3f} | {tokens / median:8.0f} "
            f"| {1000 * median / args.max_new_tokens:18.2f} | {warm[p]:12.1f} |"
        )
    print(f"static / loop: {statistics.median(seconds['static']) / statistics.median(seconds['loop']):.2f}")


def prefix_paths(args: argparse.Namespace) -> None:
    import torch

    from sapo_node import shared_prefix
    from sapo_node.generate import _sample_rows, encode_prompt, pad_id
    from sapo_node.grpo import collate_groups, completion_logprobs
    from sapo_node.models import load_policy
    from sapo_node.prompts import format_prompt
    from sapo_node.sample import sample_questions
    from sapo_node.tasks import CATALOGUES, TaskStream

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, device = load_policy(args.model, device=args.device, cache_dir=args.cache_dir)
    stream = TaskStream(CATALOGUES[args.catalogue], seed=0)
    prompt_ids = [
        encode_prompt(tokenizer, format_prompt(tokenizer, q.question)) for q in sample_questions(stream, args.questions)
    ]
    owners = [b for b in range(len(prompt_ids)) for _ in range(args.generations)]
    pad = pad_id(tokenizer)
    shared_len = shared_prefix.shared_prefix(prompt_ids)
    threshold = shared_prefix.MIN_SHARED_PREFIX

    def generate() -> list[list[int]]:
        with torch.inference_mode():
            rows, _ = _sample_rows(model, prompt_ids, owners, set(), pad, args.max_new_tokens, args.temperature)
        return rows

    completions = generate()
    advantages = torch.randn(len(owners), generator=torch.Generator().manual_seed(0)).tolist()
    rows = [(prompt_ids[b], c, a) for b, c, a in zip(owners, completions, advantages, strict=True)]

    def update() -> None:
        # The update's forward and backward passes over the round's micro-batches (no optimizer step:
        # both paths see the same weights).
        model.train()
        model.zero_grad(set_to_none=True)
        for i in range(0, len(rows), args.micro_batch):
            completion_logprobs(model, collate_groups(rows[i : i + args.micro_batch], pad, device)).sum().backward()
        model.eval()

    def timed(path: str, phase) -> float:
        shared_prefix.MIN_SHARED_PREFIX = threshold if path == "shared" else 1 << 30
        started = time.perf_counter()
        phase()
        return time.perf_counter() - started

    load_start = os.getloadavg()
    paths, phases = ("shared", "whole"), {"generate": generate, "update": update}
    for p in paths:  # warm-up, not counted
        timed(p, update)
    seconds = {(p, ph): [] for p in paths for ph in phases}
    for r in range(args.rounds):
        for p in paths if r % 2 == 0 else paths[::-1]:
            for ph, fn in phases.items():
                seconds[p, ph].append(timed(p, fn))
    shared_prefix.MIN_SHARED_PREFIX = threshold
    lengths = sorted(map(len, prompt_ids))
    print(
        f"model {args.model}, {args.questions} prompts of {lengths[0]}-{lengths[-1]} tokens sharing their first "
        f"{shared_len}, G={args.generations}, {args.max_new_tokens} new tokens, micro-batch {args.micro_batch}, "
        f"{args.rounds} timed rounds each, alternating; torch threads {torch.get_num_threads()}; "
        f"load average at start {load_start[0]:.2f}, at end {os.getloadavg()[0]:.2f}"
    )
    print("| phase | shared prefix once, median s | each prompt whole, median s | ratio |")
    print("|---|---:|---:|---:|")
    for ph in phases:
        a, b = statistics.median(seconds["shared", ph]), statistics.median(seconds["whole", ph])
        print(f"| {ph} | {a:.3f} | {b:.3f} | {a / b:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cache-dir", default=None, help="where the built-in models are (default: $SAPO_CACHE)")
    parser.add_argument("--catalogue", default="easy", choices=["easy", "sapo"])
    parser.add_argument("--questions", type=int, default=8, help="B")
    parser.add_argument("--generations", type=int, default=8, help="G")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument(
        "--micro-batch", type=int, default=16, help="sequences per forward/backward pass (all variants)"
    )
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (after one warm-up)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--train-all", action="store_true", help="sapo-node and incumbent also train on zero-advantage groups, as TRL"
    )
    parser.add_argument("--trl", action="store_true", help="add TRL's GRPOTrainer (requirements/bench-trl.txt)")
    parser.add_argument("--no-incumbent", action="store_true", help="leave out the incumbent")
    parser.add_argument("--force", action="store_true", help=f"print ratios even above load {MAX_QUIET_LOAD}")
    parser.add_argument("--paths", action="store_true", help="time generation alone on its two paths (see above)")
    parser.add_argument(
        "--prefix-paths", action="store_true", help="time generation and the update with the shared prefix and without"
    )
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.paths:
        return generation_paths(args)
    if args.prefix_paths:
        return prefix_paths(args)
    if args.variant == "trl":
        return trl_child(args)
    if args.variant:
        return sapo_child(args)
    if (args.questions * args.generations) % args.micro_batch:
        parser.error("--micro-batch must divide B*G (TRL's gradient accumulation makes one step of B*G rows)")

    variants = ["sapo-node"] + ([] if args.no_incumbent else ["incumbent"]) + (["trl"] if args.trl else [])
    prebuild(args)
    load_start = os.getloadavg()
    children, startup = {}, {}
    try:
        for v in variants:  # one at a time
            children[v] = Child(v, args)
            startup[v] = children[v].read()["ready"]
        rounds: dict[str, list[dict]] = {v: [] for v in variants}
        busy0, cpu0, wall0 = busy_cpu_seconds(), sum(c.cpu_seconds() for c in children.values()), time.perf_counter()
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                rounds[v].append(children[v].send("round"))
        busy1, cpu1, wall1 = busy_cpu_seconds(), sum(c.cpu_seconds() for c in children.values()), time.perf_counter()
        final = {v: c.send("stop") for v, c in children.items()}
    finally:
        for c in children.values():
            if c.proc.poll() is None:
                c.proc.kill()
            c.proc.wait()
    load_end = os.getloadavg()

    threads = final["sapo-node"]["threads"]
    print(
        f"model {args.model}, B={args.questions}, G={args.generations}, max_new_tokens={args.max_new_tokens}, "
        f"temperature {args.temperature:g}, micro-batch {args.micro_batch}, {args.rounds} timed rounds each "
        f"(+1 warm-up), alternating; device {final['sapo-node']['device']}, torch threads {threads}"
    )
    others = None
    if busy0 is not None and busy1 is not None:
        others = max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / (wall1 - wall0)
    print(
        f"load average (1, 5, 15 min) at start {', '.join(f'{x:.2f}' for x in load_start)}; "
        f"at end {', '.join(f'{x:.2f}' for x in load_end)}"
        + (f"; other processes used {others:.2f} CPUs during the timed rounds" if others is not None else "")
    )
    header = (
        "| variant   | dtype    | s/round | min s | rollout s | update s | gen tokens | rollout tok/s | rows trained "
        "| peak RSS MiB | CUDA peak MiB | start-up s |"
    )
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    summary = {}
    for v in variants:
        rs, f = rounds[v], final[v]
        mean = {k: statistics.fmean(r[k] for r in rs) for k in ("total", "rollout", "update", "tokens", "trained")}
        summary[v] = {**mean, "min": min(r["total"] for r in rs), **f}
        cuda = f"{f['cuda_peak_mib']:.0f}" if f["cuda_peak_mib"] is not None else "-"
        print(
            f"| {v:<9} | {f['dtype']:<8} | {mean['total']:7.3f} | {summary[v]['min']:5.3f} | {mean['rollout']:9.3f} "
            f"| {mean['update']:8.3f} | {mean['tokens']:10.0f} | {mean['tokens'] / mean['rollout']:13.0f} "
            f"| {mean['trained']:12.1f} | {f['peak_rss_mib']:12.0f} "
            f"| {cuda:>13} | {startup[v]:10.1f} |"
        )

    for v in variants:
        if all("generate" in r for r in rounds[v]):
            phases = {k: statistics.fmean(r[k] for r in rounds[v]) for k in ("generate", "score", "update")}
            print(f"{v} phases (s/round): " + ", ".join(f"{k} {x:.3f}" for k, x in phases.items()))

    # The benchmark itself keeps `threads` CPUs busy; the rest of the end load is other processes'.
    background = max(load_start[0], load_end[0] - threads)
    ours = summary["sapo-node"]
    lines = []
    if "trl" in summary:
        trl = summary["trl"]
        lines.append(
            f"sapo-node / TRL: s/round {ours['total'] / trl['total']:.2f} (target <= 0.80), "
            f"peak RSS {ours['peak_rss_mib'] / trl['peak_rss_mib']:.2f}"
        )
    if "incumbent" in summary:
        inc = summary["incumbent"]
        lines.append(
            f"incumbent / sapo-node: s/round {inc['total'] / ours['total']:.1f}x "
            f"(rollout {inc['rollout'] / ours['rollout']:.1f}x)"
        )
    if lines and background > MAX_QUIET_LOAD and not args.force:
        print(
            f"WARNING: load from other processes {background:.2f} > {MAX_QUIET_LOAD}: ratios not published; rerun "
            "on a quiet machine, or pass --force to print them anyway",
            file=sys.stderr,
        )
        sys.exit(3)
    for line in lines:
        print(
            line
            + (
                f"   [taken at load {background:.2f} > {MAX_QUIET_LOAD}: --force]"
                if background > MAX_QUIET_LOAD
                else ""
            )
        )


if __name__ == "__main__":
    main()
