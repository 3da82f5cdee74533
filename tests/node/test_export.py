"""`sapo-node export`: a real tiny-mini run, trained offline, written as a Hugging Face folder that
transformers loads and generates from, with a model card whose evaluation is the command's own."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from sapo_node.checkpoint import latest_checkpoint
from sapo_node.cli import main
from sapo_node.export import model_names, swarm_line
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE
from sapo_node.tiny.evaluation import evaluate

ROUND = [
    "--questions",
    "2",
    "--generations",
    "4",
    "--local",
    "2",
    "--max-new-tokens",
    "8",
    "--seed",
    "3",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def exported(tiny_mini_policy, tiny_cache_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(run folder, export folder) of a two-round offline run of the built-in tiny-mini."""
    root = tmp_path_factory.mktemp("export")
    run, folder = root / "run", root / "exported"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAPO_CACHE", str(tiny_cache_dir))
        assert main(["run", "--offline", "--model", "tiny-mini", "--rounds", "2", "--out", str(run), *ROUND]) == 0
        assert main(["export", "--run", str(run), "--out", str(folder), "-n", "3"]) == 0
    return run, folder


def test_the_exported_folder_loads_with_from_pretrained_and_generates(exported):
    run, folder = exported
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= names
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer([format_prompt(tokenizer, "What is 2 + 3?")], return_tensors="pt", add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=6, do_sample=False)
    assert out.shape[1] > batch["input_ids"].shape[1]
    assert tokenizer.decode(out[0, batch["input_ids"].shape[1] :]).strip()
    # the weights are the trained checkpoint's, not the base model's
    trained = torch.load(latest_checkpoint(run) / "model.pt", weights_only=True)
    written = load_file(folder / "model.safetensors")
    assert torch.equal(written["model.layers.0.mlp.up_proj.weight"], trained["model.layers.0.mlp.up_proj.weight"])


def test_the_card_carries_the_run_and_the_commands_own_evaluation(exported, tiny_mini_policy):
    run, folder = exported
    card = (folder / "README.md").read_text()
    config = json.loads((run / "config.json").read_text())
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "| rounds trained | 2 |" in card
    assert "| I own groups, J external groups per round | 2, 0 (fixed) |" in card
    assert "| external groups' baseline | group |" in card
    assert "trained alone (silo)" in card and config["offline"] is True
    assert "base_model:" not in card  # a built-in model has no hub id
    # the "before" columns are the base model's held-out scores, recomputed here independently
    model, tokenizer = tiny_mini_policy
    greedy = evaluate(model, tokenizer, n=3, temperature=0.0, max_new_tokens=8)
    sampled = evaluate(model, tokenizer, n=3, temperature=1.0, max_new_tokens=8)
    for spec in EASY_CATALOGUE.tasks:
        row = next(line for line in card.splitlines() if line.startswith(f"| {spec.dataset} |"))
        cells = [float(c) for c in row.strip("|").split("|")[1:]]
        assert cells[0] == pytest.approx(greedy[spec.dataset], abs=5e-4)
        assert cells[2] == pytest.approx(sampled[spec.dataset], abs=5e-4)
    assert "| **mean** |" in card


def test_a_folder_that_is_not_a_run_or_has_no_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["export", "--run", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "has no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model": "tiny-mini", "offline": True, "seed": 1}))
    assert main(["export", "--run", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "has no checkpoint yet" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_base_model_that_cannot_be_loaded_is_a_clear_error(exported, tmp_path, capsys):
    run, _ = exported
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "model": str(tmp_path / "moved-away")}))
    assert main(["export", "--run", str(copy), "--out", str(tmp_path / "x"), "-n", "1"]) == 2
    assert "cannot load the run's base model" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_non_empty_out_is_not_overwritten_unless_asked(exported, tmp_path, capsys):
    run, _ = exported
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["export", "--run", str(run), "--out", str(out), "-n", "1"]) == 2
    assert "is not empty" in capsys.readouterr().err and (out / "mine.txt").read_text() == "keep"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["offline", "no token", "unreachable"])
def test_push_to_hub_fails_clearly_and_keeps_the_folder(exported, tmp_path, monkeypatch, capsys, case):
    from huggingface_hub import constants

    run, _ = exported
    out = tmp_path / "exported"
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    if case != "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    if case == "unreachable":
        monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    code = main(["export", "--run", str(run), "--out", str(out), "-n", "1", "--push-to-hub", "alice/tiny-sapo"])
    err = capsys.readouterr().err
    assert code == 1
    expected = {"offline": "HF_HUB_OFFLINE", "no token": "no Hugging Face token", "unreachable": "could not push to"}
    assert expected[case] in err and f"The folder {out} is kept" in err
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()


def test_a_local_base_model_is_named_by_its_folder_only(tiny_mini_policy, tiny_cache_dir, tmp_path, monkeypatch):
    """The card, its metadata and every other file of the export leave out the folder's full path."""
    model, tokenizer = tiny_mini_policy
    base = tmp_path / "home" / "alice-private" / "models" / "my-base"
    model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    run, folder = tmp_path / "run", tmp_path / "exported"
    monkeypatch.setenv("SAPO_CACHE", str(tiny_cache_dir))
    assert main(["run", "--offline", "--model", str(base), "--rounds", "1", "--out", str(run), *ROUND]) == 0
    assert main(["export", "--run", str(run), "--out", str(folder), "-n", "1"]) == 0
    card = (folder / "README.md").read_text()
    assert "# my-base trained with SAPO" in card and "| base model | a local model folder (`my-base`) |" in card
    assert "base_model:" not in card
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"alice-private" not in data and str(tmp_path).encode() not in data, path.name


@pytest.mark.parametrize(
    ("model", "names"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct")),
        ("gpt2", ("gpt2", "gpt2")),
        ("tiny-mini", (None, "tiny-mini")),
        ("/home/alice/models/base", (None, "base")),
        ("~/models/base", (None, "base")),
        ("../models/base", (None, "base")),
        ("C:\\Users\\alice\\base", (None, "base")),
    ],
)
def test_the_card_names_a_hub_id_whole_and_a_path_by_its_last_folder(model, names):
    assert model_names(model) == names


def test_the_card_names_the_swarm_without_credentials():
    from sapo_node.config import NodeConfig

    config = NodeConfig(server="wss://bob:hunter2@sapo.example.org:8443/ws/node/?token=t", offline=False)
    assert swarm_line(config) == "the swarm at `wss://sapo.example.org:8443/ws/node/`"
