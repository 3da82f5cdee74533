"""Checkpoints: everything a stopped node needs to continue as if it had not stopped.

<out>/checkpoints/round-000012/ holds the model weights (model.pt), the optimizer state
(optimizer.pt) and state.json (round number, python/torch RNG states, the question stream's state
and catalogue, the assemble RNG). A checkpoint is written to a temporary folder and renamed into
place, so a crash mid-save leaves the previous one intact. The outbox of unacknowledged shares is on
disk already (outbox.sqlite3).

A run folder can come from someone else (`sapo-node export --run`, `--resume` of a copied folder),
so nothing in it is unpickled: the tensors load with `torch.load(weights_only=True)`, which builds
only tensors and plain containers and refuses any other object, and the rest is JSON. A checkpoint
written before state.json existed has state.pt, read the same restricted way. A file that does not
load that way raises CheckpointError and runs nothing.

A checkpoint the disk cannot take (full, or failing) is given up softly: its temporary folder is
removed, the run goes on with the previous checkpoint in place, and the log says so once (and once
when checkpoints are written again).
"""

from __future__ import annotations

import base64
import json
import logging
import pickle
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sapo_node.tasks import Catalogue, TaskStream

PREFIX = "round-"
STATE = "state.json"
#: What checkpoints wrote before STATE; read with weights_only=True only.
LEGACY_STATE = "state.pt"


class CheckpointError(Exception):
    """A checkpoint that cannot be read safely; the message names the file and what to do."""


log = logging.getLogger("sapo_node.checkpoint")
_failing = False  # the last checkpoint could not be written (logged once until one is)


@dataclass
class TrainingState:
    """The live objects a checkpoint saves and restores."""

    model: Any
    optimizer: torch.optim.Optimizer
    stream: TaskStream
    rng: random.Random


@dataclass(frozen=True)
class SavedState:
    """state.json, parsed and checked: what a checkpoint holds besides the tensors."""

    round: int
    python_rng: tuple
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor]
    stream_seed: int
    stream_state: tuple
    catalogue: Catalogue
    assemble_rng: tuple


def checkpoint_dir(out: Path) -> Path:
    return Path(out) / "checkpoints"


def _tensor_text(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _text_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)


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
    saved = {
        "round": round,
        "python_rng": random.getstate(),
        "torch_rng": _tensor_text(torch.get_rng_state()),
        "cuda_rng": [_tensor_text(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
        "stream_seed": state.stream.seed,
        "stream_state": state.stream.state(),
        "catalogue": state.stream.catalogue.to_json(),
        "assemble_rng": state.rng.getstate(),
    }
    (tmp / STATE).write_text(json.dumps(saved))


def list_checkpoints(out: Path) -> list[Path]:
    root = checkpoint_dir(out)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(out: Path) -> Path | None:
    found = list_checkpoints(out)
    return found[-1] if found else None


def load_tensors(path: Path, map_location: Any = "cpu") -> Any:
    """torch.load with weights_only=True: tensors and plain containers, nothing that runs code."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is not a checkpoint this client can read safely (only tensors and plain values are "
            f"loaded, nothing that would run code): {str(exc).splitlines()[0][:200]}"
        ) from exc


def _rng_state(value: Any) -> tuple:
    """A random.Random state from JSON lists: (version, 625 ints, gauss_next float or None)."""
    if not (isinstance(value, list | tuple) and len(value) == 3 and isinstance(value[1], list | tuple)):
        raise ValueError("an RNG state is (version, internal state, gauss_next)")
    version, internal, gauss = value
    if not all(type(v) is int for v in (version, *internal)) or not (gauss is None or type(gauss) is float):
        raise ValueError("an RNG state holds integers")
    return (version, tuple(internal), gauss)


def read_state(checkpoint: Path) -> SavedState:
    """The checkpoint's state.json (or a legacy state.pt, tensors-only), checked. Raises CheckpointError."""
    checkpoint = Path(checkpoint)
    path = checkpoint / STATE
    try:
        if path.is_file():
            raw = json.loads(path.read_text())
            torch_rng = _text_tensor(raw["torch_rng"])
            cuda_rng = [_text_tensor(s) for s in raw["cuda_rng"]]
            catalogue = raw["catalogue"]
        else:
            path = checkpoint / LEGACY_STATE
            if not path.is_file():
                raise CheckpointError(f"{checkpoint} has neither {STATE} nor {LEGACY_STATE}")
            raw = load_tensors(path)
            torch_rng, cuda_rng = raw["torch_rng"], list(raw["cuda_rng"])
            catalogue = json.loads(raw["catalogue"])
            if not isinstance(torch_rng, torch.Tensor) or not all(isinstance(s, torch.Tensor) for s in cuda_rng):
                raise ValueError("RNG states are tensors")
        if type(raw["round"]) is not int or type(raw["stream_seed"]) is not int or not isinstance(catalogue, dict):
            raise ValueError("round and stream_seed are integers, the catalogue an object")
        return SavedState(
            round=raw["round"],
            python_rng=_rng_state(raw["python_rng"]),
            torch_rng=torch_rng,
            cuda_rng=cuda_rng,
            stream_seed=raw["stream_seed"],
            stream_state=_rng_state(raw["stream_state"]),
            catalogue=Catalogue.from_json(catalogue),
            assemble_rng=_rng_state(raw["assemble_rng"]),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and binascii.Error are ValueErrors
        raise CheckpointError(f"{path} is not a checkpoint's state: {type(exc).__name__}: {exc}"[:300]) from exc


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read from disk and checked, not yet applied."""

    path: Path
    state: SavedState
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]


def read_checkpoint(path: Path, device: Any = "cpu") -> Checkpoint:
    """Read and check every file of the checkpoint at `path`. Raises CheckpointError, having run nothing."""
    saved = read_state(path)
    return Checkpoint(path, saved, load_tensors(path / "model.pt", device), load_tensors(path / "optimizer.pt", device))


def restore_checkpoint(checkpoint: Checkpoint, state: TrainingState) -> int:
    """Restore `state` in place; returns the round the checkpoint ended."""
    saved = checkpoint.state
    state.model.load_state_dict(checkpoint.model)
    state.optimizer.load_state_dict(checkpoint.optimizer)
    random.setstate(saved.python_rng)
    torch.set_rng_state(saved.torch_rng)
    if saved.cuda_rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved.cuda_rng)
    state.stream.catalogue = saved.catalogue
    state.stream.seed = saved.stream_seed
    state.stream.set_state(saved.stream_state)
    state.rng.setstate(saved.assemble_rng)
    return saved.round
