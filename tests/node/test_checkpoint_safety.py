"""A run folder may come from someone else: `sapo-node export --run` and `sapo-node run --resume`
read it without unpickling anything. A state.pt, model.pt or optimizer.pt whose object runs code when
unpickled is refused with a clear error, and the code does not run (its marker file never appears);
a checkpoint written in the earlier state.pt format still resumes and exports."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from node_toys import make_policy

from sapo_node import loop
from sapo_node.checkpoint import LEGACY_STATE, STATE, latest_checkpoint, read_state
from sapo_node.cli import main
from sapo_node.export import read_run

SMALL = ["--questions", "2", "--generations", "2", "--max-new-tokens", "6", "--local", "2", "--seed", "5"]


class Payload:
    """Unpickling this creates `marker`: what a hostile file would do with its own code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture(autouse=True)
def toy_model(monkeypatch):
    monkeypatch.setattr(loop, "load_model", lambda config: make_policy("a", seed=0))


@pytest.fixture
def run(tmp_path) -> Path:
    """A finished one-round offline run of the toy model."""
    out = tmp_path / "run"
    assert main(["run", "--offline", "--rounds", "1", "--out", str(out), *SMALL]) == 0
    return out


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _as_legacy(checkpoint: Path) -> None:
    """Rewrite state.json as the state.pt earlier clients wrote (a torch.save of RNG tuples and tensors)."""
    saved = json.loads((checkpoint / STATE).read_text())
    state = read_state(checkpoint)
    torch.save(
        {
            "round": saved["round"],
            "python_rng": state.python_rng,
            "torch_rng": state.torch_rng,
            "cuda_rng": state.cuda_rng,
            "stream_seed": saved["stream_seed"],
            "stream_state": state.stream_state,
            "catalogue": json.dumps(saved["catalogue"]),
            "assemble_rng": state.assemble_rng,
        },
        checkpoint / LEGACY_STATE,
    )
    (checkpoint / STATE).unlink()


def _plant(checkpoint: Path, name: str, marker: Path) -> None:
    """Replace one file of the checkpoint with a hostile pickle (state.pt stands for state.json)."""
    if name == LEGACY_STATE:
        (checkpoint / STATE).unlink()
        payload = {"round": 1, "catalogue": Payload(marker)}
    else:
        payload = {"weight": Payload(marker)}
    torch.save(payload, checkpoint / name)


def test_a_checkpoint_holds_no_pickle_beside_the_tensors(run):
    checkpoint = latest_checkpoint(run)
    assert {p.name for p in checkpoint.iterdir()} == {"model.pt", "optimizer.pt", STATE}
    saved = json.loads((checkpoint / STATE).read_text())
    assert saved["round"] == 1 and saved["catalogue"]["name"] == "easy"


@pytest.mark.parametrize("name", [LEGACY_STATE, "model.pt", "optimizer.pt"])
def test_resume_refuses_a_hostile_checkpoint_and_runs_none_of_it(run, tmp_path, capsys, name):
    marker = tmp_path / "ran"
    _plant(latest_checkpoint(run), name, marker)
    capsys.readouterr()
    code = main(["run", "--resume", "--offline", "--rounds", "2", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{name} is not a checkpoint this client can read safely" in err and "nothing that would run code" in err
    assert not marker.exists()
    assert [r["round"] for r in _metrics(run)] == [1]  # nothing trained on top of it


@pytest.mark.parametrize("name", [LEGACY_STATE, "model.pt"])
def test_export_refuses_a_hostile_checkpoint_and_runs_none_of_it(run, tmp_path, capsys, name):
    marker = tmp_path / "ran"
    _plant(latest_checkpoint(run), name, marker)
    out = tmp_path / "exported"
    code = main(["export", "--run", str(run), "--out", str(out), "-n", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{name} is not a checkpoint this client can read safely" in err
    assert not marker.exists() and not out.exists()


@pytest.mark.parametrize(
    "text",
    ["not json", '{"round": 1}', '{"round": "1", "torch_rng": "", "cuda_rng": [], "catalogue": {}}'],
)
def test_a_malformed_state_json_is_a_clear_error(run, tmp_path, capsys, text):
    (latest_checkpoint(run) / STATE).write_text(text)
    assert main(["run", "--resume", "--offline", "--rounds", "2", "--out", str(run)]) == 2
    assert "is not a checkpoint's state" in capsys.readouterr().err


def test_a_legacy_checkpoint_resumes_as_an_uninterrupted_run_would(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["run", "--offline", "--rounds", "2", "--out", str(straight), *SMALL]) == 0
    assert main(["run", "--offline", "--rounds", "1", "--out", str(split), *SMALL]) == 0
    _as_legacy(latest_checkpoint(split))
    random.seed(12345)  # whatever the process's RNG holds now, the checkpoint's state replaces it
    assert main(["run", "--resume", "--offline", "--rounds", "2", "--out", str(split)]) == 0
    a, b = _metrics(straight)[1], _metrics(split)[1]
    assert (a["reward_mean"], a["generated_tokens"], a["loss"]) == (b["reward_mean"], b["generated_tokens"], b["loss"])


def test_export_reads_a_legacy_checkpoint(run, tmp_path):
    legacy = tmp_path / "legacy"
    shutil.copytree(run, legacy)
    _as_legacy(latest_checkpoint(legacy))
    trained = read_run(legacy)
    assert trained.rounds == 1 and trained.catalogue == read_run(run).catalogue
