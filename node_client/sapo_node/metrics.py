"""Step 7 of a round: log it. metrics.jsonl gets one JSON object per round; the console's account of
a round is sapo_node.progress.RoundProgress."""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sapo_node.assemble import AssembleStats
from sapo_node.groups import Group, TrainGroup
from sapo_node.grpo import UpdateStats
from sapo_node.transport.base import TransportCounts

log = logging.getLogger("sapo_node.metrics")

PHASES = ("sample", "generate", "commit", "score", "share", "assemble", "update")


class PhaseTimer:
    """Seconds spent in each phase of a round."""

    def __init__(self, on_enter: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.perf_counter()
        self.on_enter = on_enter

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.on_enter is not None:
            self.on_enter(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    @property
    def total(self) -> float:
        return time.perf_counter() - self.started


def round_metrics(
    *,
    round: int,
    own: list[Group],
    new_tokens: int,
    assembled: AssembleStats,
    update: UpdateStats,
    counts: TransportCounts,
    connection: str,
    timer: PhaseTimer,
) -> dict[str, Any]:
    """Everything worth plotting about one round, as one flat JSON object."""
    rewards = [r for g in own for r in g.rewards]
    gen_seconds = timer.seconds.get("generate", 0.0)
    return {
        "round": round,
        "time": time.time(),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "zero_advantage_share": assembled.zero_advantage_share,
        "clip_fraction": update.clip_fraction,
        "loss": update.loss,
        "kl": update.kl,
        "grad_norm": update.grad_norm,
        "updated": update.steps > 0,
        "train_sequences": update.sequences,
        "train_tokens": update.tokens,
        "generated_tokens": new_tokens,
        "tokens_per_s": new_tokens / gen_seconds if gen_seconds > 0 else 0.0,
        "local_offered": assembled.local_offered,
        "local_kept": assembled.local_kept,
        "external_offered": assembled.external_offered,
        "external_kept": assembled.external_kept,
        "external_invalid": assembled.external_invalid,
        "external_rescored": assembled.external_rescored,
        "external_corrected": assembled.external_corrected,
        "external_uncorrected": sum(assembled.external_uncorrected.values()),
        "external_no_success": assembled.external_no_success,
        "corrected": update.corrected,
        "correction_weight": update.correction_weight,
        "filtered": update.filtered,
        "accepted": counts.accepted,
        "rejected": counts.rejected,
        "refused": counts.refused,
        "pending": counts.pending,
        "connection": connection,
        "seconds": {phase: round_s(timer.seconds.get(phase, 0.0)) for phase in PHASES}
        | {"total": round_s(timer.total)},
    }


def round_s(x: float) -> float:
    return round(x, 4)


def round_report(
    round: int, metrics: dict[str, Any], used: list[TrainGroup], *, local: int, external: int
) -> dict[str, Any]:
    """The protocol `report` of a round (self-reported figures; `used` credits the groups' authors).

    `local` and `external` are the node's configured I and J: J = 0 is a node in silo, which the
    swarm page compares with the sharing ones."""
    return {
        "round": round,
        "local": local,
        "external": external,
        "reward_mean": metrics["reward_mean"],
        "reward_std": metrics["reward_std"],
        "groups_local": metrics["local_kept"],
        "groups_external": metrics["external_kept"],
        "groups_dropped": metrics["local_offered"]
        + metrics["external_offered"]
        - metrics["local_kept"]
        - metrics["external_kept"],
        "loss": metrics["loss"],
        "used": [g.id for g in used],
    }


class MetricsLog:
    """Appends one JSON line per round to metrics.jsonl (a resumed run appends to the same file). A
    line the disk cannot take (full) is left out whole, the run goes on, and the log says so once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.failing = False

    def write(self, row: dict[str, Any]) -> None:
        data = (json.dumps(row) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError:
                    os.ftruncate(fd, start)  # no half line for a reader to trip on
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            if not self.failing:
                self.failing = True
                log.error("metrics.jsonl cannot be written (%s); rounds go on unrecorded until it can", exc)
            return
        if self.failing:
            self.failing = False
            log.warning("metrics.jsonl is written again")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
