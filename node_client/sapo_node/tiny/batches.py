"""The warm start's batches: which entries each step draws, built here or in worker processes
ahead of training, and the padded tensors of (question, answer) pairs."""

from __future__ import annotations

import collections
import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import torch

from sapo_node.prompts import format_prompt, format_target
from sapo_node.tasks import MAX_INDEX, TaskSpec, entries_at, entries_of


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


#: One step's draws: the dataset, its seed, the drawn indices, and which targets are bare (None: none).
BatchDraw = tuple[TaskSpec, int, list[int], "list[bool] | None"]


def batch_draws(
    tasks: list[TaskSpec], seed: int, rng: random.Random, steps: int, batch_size: int, bare_share: float
) -> Iterator[BatchDraw]:
    for step in range(steps):
        spec = tasks[step % len(tasks)]
        indices = [rng.randrange(MAX_INDEX) for _ in range(batch_size)]
        bare = [rng.random() < bare_share for _ in indices] if bare_share > 0 else None
        yield spec, seed, indices, bare


@contextlib.contextmanager
def batch_builder(workers: int) -> Iterator[Any]:
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
