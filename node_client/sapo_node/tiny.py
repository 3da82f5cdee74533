"""The built-in tiny policies: a Qwen2-architecture model built from a config, its own byte-level
BPE tokenizer trained on reasoning-gym text, and a short supervised warm start on the easy
catalogue so it starts with partial accuracy (GRPO learns nothing from groups that all fail or
all succeed).

This module downloads nothing. The first `load_tiny` builds the model (about a minute on 2 idle CPU
cores for "tiny") and saves it under <cache_dir>/<variant>-<recipe hash>/; later loads read it back.
Two processes building the same recipe at once serialise on a file lock. A node first asks its site
for the same model prebuilt (sapo_node.prebuilt, passed in as `fetch`) and builds only without one.

    python -m sapo_node.tiny --variant tiny --eval     # build or load, then print accuracy
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from sapo_node.progress import progress_bar
from sapo_node.prompts import format_plain, format_prompt, format_target
from sapo_node.tasks import (
    CATALOGUES,
    EASY_CATALOGUE,
    MAX_INDEX,
    SAPO_CATALOGUE,
    Catalogue,
    TaskSpec,
    build_entries,
    entries_at,
    entries_of,
    score_completion,
)

#: Bump when the build changes in a way the variant fields do not capture: old caches are then ignored.
RECIPE_VERSION = 1

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

#: Dataset seeds: the warm start draws from TRAIN_SEED + seed, evaluation from EVAL_SEED (held out).
TRAIN_SEED = 1000
EVAL_SEED = 987_654

#: The file that marks a finished build; it records the recipe and what the build measured.
BUILD_INFO = "build.json"


@dataclass(frozen=True)
class TinyVariant:
    """A recipe: tokenizer, architecture and warm start of one built-in model."""

    name: str
    #: Target vocabulary of the byte-level BPE tokenizer (256 bytes + special tokens + merges).
    vocab_size: int
    #: Split numbers into single digits before BPE (a different tokenizer from the same text).
    split_digits: bool
    #: Seed of the reasoning-gym questions the tokenizer is trained on, and how many per dataset.
    tokenizer_seed: int
    tokenizer_examples: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    #: Warm start: optimizer steps, examples per step, peak learning rate.
    steps: int
    batch_size: int
    lr: float
    #: Datasets of the easy catalogue the warm start teaches (empty: all of them). Variants that know
    #: different datasets give nodes different competences (the skill-transfer study).
    known: tuple[str, ...] = ()
    #: A second supervised phase after the warm start, on the same datasets: steps, peak learning rate,
    #: and the share of its targets given as the bare answer (" 7" instead of " <answer>7</answer>").
    #: The model keeps what it knows but uses the answer format unreliably, which GRPO can fix: a
    #: warm start that already answers in format leaves GRPO little it can find (docs/experiment.md).
    format_steps: int = 0
    format_lr: float = 0.0
    bare_share: float = 0.0
    #: The catalogue the tokenizer and the warm start draw from: easy, or sapo (the paper's nine tasks).
    catalogue: str = "easy"


VARIANTS: dict[str, TinyVariant] = {
    "tiny": TinyVariant(
        name="tiny",
        vocab_size=2048,
        split_digits=False,
        tokenizer_seed=11,
        tokenizer_examples=300,
        hidden_size=256,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=704,
        steps=200,
        batch_size=32,
        lr=2e-3,
    ),
    "tiny-mini": TinyVariant(
        name="tiny-mini",
        vocab_size=1024,
        split_digits=True,
        tokenizer_seed=23,
        tokenizer_examples=200,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=384,
        steps=150,
        batch_size=32,
        lr=3e-3,
    ),
}

#: The architecture and tokenizer of tiny-mini with a longer warm start and a format phase: the
#: built-in model whose reward GRPO raises within tens of rounds (the `cpu-learn` preset).
_LEARN = dataclasses.replace(VARIANTS["tiny-mini"], steps=1000, format_steps=150, format_lr=1e-3, bare_share=0.8)
VARIANTS["tiny-learn"] = dataclasses.replace(_LEARN, name="tiny-learn")
# Two halves of the easy catalogue, one per variant: nodes that know different things (skill
# transfer). 600 steps over two datasets teach each of them more than tiny-learn's 1000 over four.
VARIANTS["tiny-learn-a"] = dataclasses.replace(
    _LEARN, name="tiny-learn-a", steps=600, known=("basic_arithmetic", "calendar_arithmetic")
)
VARIANTS["tiny-learn-b"] = dataclasses.replace(
    _LEARN, name="tiny-learn-b", steps=600, known=("base_conversion", "fraction_simplification")
)
#: tiny-learn with the format almost never used (95% of the format phase's targets bare): most of a
#: node's own groups score 0 in every completion at the start, so an informative group is rare and
#: one found elsewhere in the swarm is worth most (the `cpu-swarm` preset, docs/experiment.md).
VARIANTS["tiny-sparse"] = dataclasses.replace(_LEARN, name="tiny-sparse", bare_share=0.95)
#: A larger model for a GPU (about 26M parameters), built locally from the paper's nine tasks: the
#: `gpu-learn` preset, which needs no hub. Building it on a CPU takes hours; on a GPU minutes (not measured yet).
VARIANTS["small"] = TinyVariant(
    name="small",
    vocab_size=4096,
    split_digits=True,
    tokenizer_seed=31,
    tokenizer_examples=400,
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    intermediate_size=1408,
    steps=4000,
    batch_size=64,
    lr=1e-3,
    format_steps=300,
    format_lr=3e-4,
    bare_share=0.8,
    catalogue="sapo",
)


def get_variant(name: str) -> TinyVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown tiny variant {name!r}; choose from {sorted(VARIANTS)}") from None


# --- tokenizer ---------------------------------------------------------------------------------


def tokenizer_corpus(variant: TinyVariant) -> list[str]:
    """Prompt+target texts of reasoning-gym entries: mostly the easy catalogue, some full configs."""
    texts = []
    mix = ((EASY_CATALOGUE, variant.tokenizer_examples), (SAPO_CATALOGUE, variant.tokenizer_examples // 10))
    if variant.catalogue == "sapo":
        mix = ((SAPO_CATALOGUE, variant.tokenizer_examples), (EASY_CATALOGUE, variant.tokenizer_examples // 10))
    for catalogue, n in mix:
        for spec in catalogue.tasks:
            for entry in build_entries(spec, variant.tokenizer_seed, n):
                texts.append(format_plain(entry["question"]) + format_target(str(entry["answer"])))
    return texts


def train_tokenizer(variant: TinyVariant) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text round-trips) with <|endoftext|> as eos and <|pad|>."""
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if variant.split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=variant.vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(variant), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=2048,
    )


# --- model -------------------------------------------------------------------------------------


def build_model(variant: TinyVariant, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=variant.hidden_size,
        intermediate_size=variant.intermediate_size,
        num_hidden_layers=variant.num_layers,
        num_attention_heads=variant.num_heads,
        num_key_value_heads=variant.num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- warm start --------------------------------------------------------------------------------


def supervised_batch(
    tokenizer: Any, entries: list[dict[str, Any]], bare: list[bool] | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels), right-padded; labels cover the answer and eos only.
    `bare[i]` gives entry i's target as the bare answer, without the <answer> tags."""
    bare = bare or [False] * len(entries)
    prompts = tokenizer([format_prompt(tokenizer, e["question"]) for e in entries], add_special_tokens=False)[
        "input_ids"
    ]
    texts = [
        format_bare(str(e["answer"])) if b else format_target(str(e["answer"]))
        for e, b in zip(entries, bare, strict=True)
    ]
    targets = tokenizer(texts, add_special_tokens=False)["input_ids"]
    rows = [(p, t + [tokenizer.eos_token_id]) for p, t in zip(prompts, targets, strict=True)]
    width = max(len(p) + len(t) for p, t in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # (B, T)
    for i, (p, t) in enumerate(rows):
        n = len(p) + len(t)
        input_ids[i, :n] = torch.tensor(p + t)
        attention_mask[i, :n] = 1
        labels[i, len(p) : n] = torch.tensor(t)
    return input_ids, attention_mask, labels


def format_bare(answer: str) -> str:
    """A target without the answer tags (the format phase): the verifier scores it 0."""
    return f" {answer.strip()}"


def known_catalogue(variant: TinyVariant) -> Catalogue:
    """The part of its catalogue `variant`'s warm start teaches."""
    catalogue = CATALOGUES[variant.catalogue]
    if not variant.known:
        return catalogue
    tasks = tuple(spec for spec in catalogue.tasks if spec.dataset in variant.known)
    if len(tasks) != len(variant.known):
        raise ValueError(f"variant {variant.name}: {variant.known} is not a subset of catalogue {catalogue.name}")
    return Catalogue(name=f"{catalogue.name}:{'+'.join(variant.known)}", tasks=tasks)


def warm_start(
    model: Qwen2ForCausalLM,
    tokenizer: Any,
    variant: TinyVariant,
    *,
    seed: int,
    steps: int,
    catalogue: Catalogue = EASY_CATALOGUE,
    lr: float | None = None,
    bare_share: float = 0.0,
    phase: int = 0,
    progress: bool = True,
    workers: int = 0,
) -> float:
    """Supervised fine-tuning on (question, answer) pairs of `catalogue`; returns the final loss (EMA).

    Each step's batch comes from one dataset, in turn: questions of one dataset have similar
    lengths, so little compute goes to padding (the long base-conversion prompts would otherwise
    set the width of every batch). A share `bare_share` of the targets (drawn per example) is the
    bare answer without tags. `phase` > 0 draws from its own question stream (the format phase).

    `workers` > 0 builds the batches' entries in that many processes, ahead of the training steps
    (reasoning-gym's generators, not the model, set the pace of a build on a GPU); the batches are
    the same as with none: every draw is made here, in order, and a worker only rebuilds entries.
    """
    rng = random.Random(TRAIN_SEED + seed + 7919 * phase)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=variant.lr if lr is None else lr, betas=(0.9, 0.95), weight_decay=0.01
    )
    warmup = max(1, steps // 10)

    def lr_factor(step: int) -> float:  # linear warm-up, cosine decay to a tenth
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    # Tasks without a single answer (propositional_logic) have no target to imitate.
    tasks = [spec for spec in catalogue.tasks if build_entries(spec, TRAIN_SEED + seed, 1)[0]["answer"] is not None]
    draws = _batch_draws(tasks, TRAIN_SEED + seed, rng, steps, variant.batch_size, bare_share)
    model.train()
    ema = float("nan")
    bar = progress_bar(total=steps, desc=f"warm start {variant.name}", unit="step", disable=not progress, leave=False)
    with _batch_builder(workers) as build:
        for entries, bare in build(draws):
            input_ids, attention_mask, labels = (t.to(model.device) for t in supervised_batch(tokenizer, entries, bare))
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=model.device.type == "cuda"):
                loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            ema = loss.item() if math.isnan(ema) else 0.9 * ema + 0.1 * loss.item()
            bar.update(1)
            bar.set_postfix(loss=f"{ema:.3f}")
    bar.close()
    model.eval()
    return ema


#: One step's draws: the dataset, its seed, the drawn indices, and which targets are bare (None: none).
BatchDraw = tuple[TaskSpec, int, list[int], "list[bool] | None"]


def _batch_draws(
    tasks: list[TaskSpec], seed: int, rng: random.Random, steps: int, batch_size: int, bare_share: float
) -> Iterator[BatchDraw]:
    for step in range(steps):
        spec = tasks[step % len(tasks)]
        indices = [rng.randrange(MAX_INDEX) for _ in range(batch_size)]
        bare = [rng.random() < bare_share for _ in indices] if bare_share > 0 else None
        yield spec, seed, indices, bare


@contextlib.contextmanager
def _batch_builder(workers: int) -> Iterator[Any]:
    """A function from an iterator of draws to an iterator of (entries, bare flags), in order: built
    here, or in `workers` processes that keep a few batches ahead of training."""
    if workers <= 0:
        yield lambda draws: ((entries_at(spec, seed, indices), bare) for spec, seed, indices, bare in draws)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    def built(pool: Any, draws: Iterator[BatchDraw]) -> Iterator[tuple[list[dict[str, Any]], list[bool] | None]]:
        ahead: collections.deque = collections.deque()
        for spec, seed, indices, bare in draws:
            ahead.append((pool.submit(entries_of, (spec, seed, indices)), bare))
            if len(ahead) > 2 * workers:
                future, kept = ahead.popleft()
                yield future.result(), kept
        while ahead:
            future, kept = ahead.popleft()
            yield future.result(), kept

    # spawn: the parent may hold a CUDA context, which a forked child must not inherit. The workers
    # import sapo_node.tasks only (reasoning-gym, no torch). An executor rather than a Pool: a worker
    # that dies (one that cannot even start, say) breaks the build with BrokenProcessPool at once, where
    # a Pool starts a replacement forever.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield lambda draws: built(pool, draws)


def default_workers(device: str) -> int:
    """Entry-building processes for a build on `device`: $SAPO_BUILD_WORKERS when set, else on a GPU all
    cores but one (up to 16), on a CPU none (training uses the cores there)."""
    if os.environ.get("SAPO_BUILD_WORKERS", "").strip().isdigit():
        return int(os.environ["SAPO_BUILD_WORKERS"])
    if not str(device).startswith("cuda"):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(16, cores - 1))


# --- evaluation --------------------------------------------------------------------------------


def generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int = 24,
    temperature: float = 0.0,
    num_return_sequences: int = 1,
    min_new_tokens: int | None = None,
) -> list[str]:
    """Completion texts (special tokens dropped), prompt-major order: the evaluation's generator (the
    export's card, a study's held-out check, bench/answers.py) and the tests'.

    temperature 0 is greedy; otherwise plain sampling (no top-k/top-p), as the node samples. They come
    from the node's own sampler (`sapo_node.generate.generate_groups`): the prompts' shared start runs
    once and finished rows leave the batch, which made SmolLM2's greedy evaluation 3.2-4.1x faster
    than transformers' `model.generate` with the same completions (50 questions per easy dataset, one
    thread, load average 2.0). `min_new_tokens` (a benchmark's
    fixed length) needs a processor the sampler has not, so it goes to `model.generate`.
    """
    if not min_new_tokens:
        from sapo_node.generate import generate_groups

        groups = generate_groups(
            model,
            tokenizer,
            prompts,
            generations=num_return_sequences,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
        )
        return [text for group in groups for text in group.texts]
    return _hf_generate_texts(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        num_return_sequences=num_return_sequences,
        min_new_tokens=min_new_tokens,
    )


@torch.no_grad()
def _hf_generate_texts(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float,
    num_return_sequences: int,
    min_new_tokens: int,
) -> list[str]:
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    kwargs: dict[str, Any] = {"do_sample": False}
    if temperature > 0:
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    out = model.generate(
        **batch,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        num_return_sequences=num_return_sequences,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **kwargs,
    )
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def heldout_answers(
    model: Any,
    tokenizer: Any,
    spec: TaskSpec,
    *,
    n: int,
    seed: int = EVAL_SEED,
    temperature: float = 0.0,
    max_new_tokens: int = 24,
    batch: int = 0,
    few_shot: bool = True,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Questions 0..n-1 of `spec` at dataset seed `seed` and the model's completions with the node's
    prompt (`few_shot` False: without its worked turns), `batch` prompts per generation (0: all n)."""
    entries = build_entries(spec, seed, n)
    step = batch or max(n, 1)
    texts: list[str] = []
    for at in range(0, n, step):
        prompts = [format_prompt(tokenizer, e["question"], few_shot=few_shot) for e in entries[at : at + step]]
        texts += generate_texts(model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature)
    return entries, texts


def evaluate(
    model: Any,
    tokenizer: Any,
    *,
    catalogue: Catalogue = EASY_CATALOGUE,
    n: int = 64,
    seed: int = EVAL_SEED,
    temperature: float = 0.0,
    max_new_tokens: int = 24,
) -> dict[str, float]:
    """Mean score per dataset on questions 0..n-1 of dataset seed `seed` (held out from the warm start)."""
    torch.manual_seed(seed)
    scores = {}
    for spec in catalogue.tasks:
        entries, completions = heldout_answers(
            model, tokenizer, spec, n=n, seed=seed, temperature=temperature, max_new_tokens=max_new_tokens
        )
        scores[spec.dataset] = (
            sum(score_completion(spec, seed, e, c) for e, c in zip(entries, completions, strict=True)) / n
        )
    return scores


# --- cache -------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    return Path(os.environ.get("SAPO_CACHE") or Path.home() / ".cache" / "sapo-node")


#: Recipe fields added after the first builds: left out of the hash at their defaults, so the
#: caches of tiny and tiny-mini built before them stay valid.
_LATER_FIELDS = {"known": (), "format_steps": 0, "format_lr": 0.0, "bare_share": 0.0, "catalogue": "easy"}


def recipe(variant: TinyVariant, seed: int, steps: int) -> dict[str, Any]:
    """Everything the built model depends on; its hash names the cache folder."""
    fields = dataclasses.asdict(dataclasses.replace(variant, steps=steps))
    for name, default in _LATER_FIELDS.items():
        if fields[name] == default or fields[name] == list(default or ()):
            del fields[name]
    if "known" in fields:
        fields["known"] = list(fields["known"])
    out = {
        "version": RECIPE_VERSION,
        "variant": fields,
        "seed": seed,
        "catalogue": CATALOGUES[variant.catalogue].to_json(),
        "prompt": format_plain("{question}") + format_target("{answer}"),
    }
    if variant.bare_share:
        out["bare"] = format_bare("{answer}")
    return out


def recipe_digest(variant: str = "tiny", seed: int = 0, steps: int | None = None) -> str:
    """sha256 (hex) of the recipe: a prebuilt model is taken only when its digest is this one."""
    spec = get_variant(variant)
    text = json.dumps(recipe(spec, seed, spec.steps if steps is None else steps), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def tiny_path(variant: str = "tiny", cache_dir: Path | None = None, seed: int = 0, steps: int | None = None) -> Path:
    """Where `load_tiny` with these arguments keeps its model."""
    digest = recipe_digest(variant, seed, steps)[:12]
    return Path(cache_dir or default_cache_dir()) / f"{variant}-{digest}"


def build_info(path: Path) -> dict[str, Any] | None:
    """What a finished build recorded (recipe, params, timings), or None if there is none at `path`."""
    try:
        return json.loads((Path(path) / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None


def build_tiny(
    variant: str = "tiny",
    seed: int = 0,
    steps: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    workers: int | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    """Train the tokenizer, build the model and warm-start it (on `device`, in bfloat16 autocast on
    CUDA; entries built in `workers` processes, default_workers(device) when None), without touching
    the cache. The model comes back on the CPU in float32."""
    spec = get_variant(variant)
    steps = spec.steps if steps is None else steps
    started = time.perf_counter()
    tokenizer = train_tokenizer(spec)
    tokenizer_seconds = time.perf_counter() - started
    model = build_model(spec, tokenizer, seed).to(device)
    started = time.perf_counter()
    catalogue = known_catalogue(spec)
    workers = default_workers(device) if workers is None else workers
    loss = warm_start(
        model, tokenizer, spec, seed=seed, steps=steps, catalogue=catalogue, progress=progress, workers=workers
    )
    warm_seconds = time.perf_counter() - started
    if spec.format_steps:
        loss = warm_start(
            model,
            tokenizer,
            spec,
            seed=seed,
            steps=spec.format_steps,
            catalogue=catalogue,
            lr=spec.format_lr,
            bare_share=spec.bare_share,
            phase=1,
            progress=progress,
            workers=workers,
        )
    info = {
        "recipe": recipe(spec, seed, steps),
        "params": count_params(model),
        "vocab_size": len(tokenizer),
        "tokenizer_seconds": round(tokenizer_seconds, 3),
        "warm_start_seconds": round(warm_seconds, 2),
        "format_seconds": round(time.perf_counter() - started - warm_seconds, 2),
        "final_loss": round(loss, 4),
        "torch_threads": torch.get_num_threads(),
        "entry_workers": workers,
        "device": str(device),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return model.to("cpu"), tokenizer, info


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No "Loading weights" / "Writing model shards" bars for a model of a few megabytes."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def staging_dir(path: Path) -> Path:
    """A fresh folder beside `path` to write its model in before renaming it into place: a crash
    never leaves a half-written model that a later load would take for a finished one."""
    return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))


def drop_stale_staging(path: Path) -> None:
    """Remove what a killed build or download left beside `path`. Caller holds `path`'s lock, so no
    live writer owns any of them."""
    for stale in path.parent.glob(f".{path.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def load_tiny(
    variant: str = "tiny",
    cache_dir: Path | None = None,
    seed: int = 0,
    steps: int | None = None,
    progress: bool = True,
    device: str = "cpu",
    fetch: Callable[[Path], bool] | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The built-in model `variant` and its tokenizer: read from the cache, else placed there by
    `fetch(path)` (a prebuilt copy: sapo_node.prebuilt; it returns False when it has none), else
    built (on `device`: the warm start of "small" wants a GPU).

    Deterministic in (variant, seed, steps) on one device. The model comes back in eval mode,
    float32, on the CPU.
    """
    path = tiny_path(variant, cache_dir, seed, steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"), quiet_transformers():
        if build_info(path) is None:
            drop_stale_staging(path)
        if build_info(path) is None and not (fetch is not None and fetch(path)):
            model, tokenizer, info = build_tiny(variant, seed, steps, progress, device)
            staging = staging_dir(path)
            try:
                model.save_pretrained(staging)
                tokenizer.save_pretrained(staging)
                (staging / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
                if path.exists():
                    shutil.rmtree(path)
                os.replace(staging, path)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model.eval()
    return model, tokenizer


# --- command line ------------------------------------------------------------------------------


def benchmark_generation(model: Any, tokenizer: Any, prompts: int = 8, completions: int = 8, tokens: int = 64) -> float:
    """Seconds to sample `prompts` x `completions` completions of exactly `tokens` new tokens, batched."""
    tasks = EASY_CATALOGUE.tasks
    entries = [build_entries(tasks[i % len(tasks)], EVAL_SEED, 1, start=i)[0] for i in range(prompts)]
    texts = [format_prompt(tokenizer, e["question"]) for e in entries]
    generate_texts(model, tokenizer, texts[:1], max_new_tokens=4, temperature=1.0)  # warm-up
    started = time.perf_counter()
    generate_texts(
        model,
        tokenizer,
        texts,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        temperature=1.0,
        num_return_sequences=completions,
    )
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sapo_node.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="tiny", choices=sorted(VARIANTS))
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $SAPO_CACHE or ~/.cache/sapo-node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None, help="warm-start steps (default: the variant's)")
    parser.add_argument("--eval", action="store_true", help="print per-dataset accuracy on held-out questions")
    parser.add_argument("-n", type=int, default=64, help="questions per dataset for --eval")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for --eval")
    parser.add_argument("--bench", action="store_true", help="time 8 prompts x 8 completions x 64 tokens")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    model, tokenizer = load_tiny(args.variant, args.cache_dir, args.seed, args.steps)
    path = tiny_path(args.variant, args.cache_dir, args.seed, args.steps)
    info = build_info(path) or {}
    print(f"{args.variant}: {path} (loaded in {time.perf_counter() - started:.1f} s)")
    print(
        f"  params {info.get('params')}, vocab {info.get('vocab_size')}, tokenizer {info.get('tokenizer_seconds')} s, "
        f"warm start {info.get('warm_start_seconds')} s on {info.get('torch_threads')} threads, "
        f"final loss {info.get('final_loss')}"
    )
    if args.eval:
        greedy = evaluate(model, tokenizer, n=args.n)
        sampled = evaluate(model, tokenizer, n=args.n, temperature=args.temperature)
        print(f"\n{'dataset':<26}{'greedy':>8}{f'T={args.temperature:g}':>8}   (n={args.n}, seed {EVAL_SEED})")
        for name in greedy:
            print(f"{name:<26}{greedy[name]:>8.1%}{sampled[name]:>8.1%}")
        mean = sum(greedy.values()) / len(greedy), sum(sampled.values()) / len(sampled)
        print(f"{'mean':<26}{mean[0]:>8.1%}{mean[1]:>8.1%}")
    if args.bench:
        seconds = benchmark_generation(model, tokenizer)
        print(f"\ngeneration: 8 prompts x 8 completions x 64 new tokens in {seconds:.2f} s")


if __name__ == "__main__":
    main()
