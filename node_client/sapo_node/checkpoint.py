"""Checkpoints: everything a stopped node needs to continue as if it had not stopped.

<out>/checkpoints/round-000012/ holds the model weights, the optimizer state and state.pt (round
number, python/torch RNG states, the question stream's state and catalogue, the assemble RNG).
A checkpoint is written to a temporary folder and renamed into place, so a crash mid-save leaves
the previous one intact. The outbox of unacknowledged shares is on disk already (outbox.sqlite3).

A checkpoint the disk cannot take (full, or failing) is given up softly: its temporary folder is
removed, the run goes on with the previous checkpoint in place, and the log says so once (and once
when checkpoints are written again).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_node.tasks import Catalogue, TaskStream

PREFIX = "round-"

log = logging.getLogger("sapo_node.checkpoint")
_failing = False  # the last checkpoint could not be written (logged once until one is)


@dataclass
class TrainingState:
    """The live objects a checkpoint saves and restores."""

    model: Any
    optimizer: torch.optim.Optimizer
    stream: TaskStream
    rng: random.Random


def checkpoint_dir(out: Path) -> Path:
    return Path(out) / "checkpoints"


def save_checkpoint(out: Path, round: int, state: TrainingState, keep: int = 2) -> Path | None:
    """Write the checkpoint of `round`; None when the disk could not take it (see the module docstring)."""
    global _failing
    root = checkpoint_dir(out)
    final = root / f"{PREFIX}{round:06d}"
    tmp = root / f".tmp-{PREFIX}{round:06d}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _write(tmp, round, state)
    # torch.save reports a failed write as RuntimeError ("PytorchStreamWriter failed writing file")
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if not _failing:
            _failing = True
            log.error(
                "checkpoint of round %d not written (%s: %s; a full disk?): the run goes on, the previous "
                "checkpoint stays in place",
                round,
                type(exc).__name__,
                str(exc)[:200],
            )
        return None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(out)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    if _failing:
        _failing = False
        log.warning("checkpoints are written again (round %d)", round)
    return final


def _write(tmp: Path, round: int, state: TrainingState) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(state.model.state_dict(), tmp / "model.pt")
    torch.save(state.optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(
        {
            "round": round,
            "python_rng": random.getstate(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "stream_seed": state.stream.seed,
            "stream_state": state.stream.state(),
            "catalogue": json.dumps(state.stream.catalogue.to_json()),
            "assemble_rng": state.rng.getstate(),
        },
        tmp / "state.pt",
    )


def list_checkpoints(out: Path) -> list[Path]:
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(out: Path) -> Path | None:
    found = list_checkpoints(out)
    return found[-1] if found else None


def load_checkpoint(path: Path, state: TrainingState) -> int:
    """Restore `state` in place from `path`; returns the round the checkpoint ended."""
    device = next(state.model.parameters()).device
    state.model.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
    state.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    saved = torch.load(path / "state.pt", weights_only=False)  # our own file: python RNG tuples
    random.setstate(saved["python_rng"])
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    state.stream.catalogue = Catalogue.from_json(json.loads(saved["catalogue"]))
    state.stream.seed = saved["stream_seed"]
    state.stream.set_state(saved["stream_state"])
    state.rng.setstate(saved["assemble_rng"])
    return int(saved["round"])
