"""Loading a policy: built-in names, any local folder through the generic path, devices and dtypes."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from sapo_node.models import describe_hardware, load_policy, prepare_tokenizer, resolve_device, resolve_dtype
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE, build_entry
from sapo_node.tiny.generation import generate_texts


def prompts(tokenizer, n=6):
    return [format_prompt(tokenizer, build_entry(EASY_CATALOGUE.tasks[i % 4], 99, i)["question"]) for i in range(n)]


def test_a_local_folder_loads_through_the_generic_path(tiny_policy, tmp_path):
    model, tokenizer = tiny_policy
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)

    loaded, loaded_tok, device = load_policy(str(tmp_path), device="cpu")

    assert device == "cpu" and loaded.dtype == torch.float32
    assert loaded_tok.padding_side == "left" and loaded_tok.pad_token_id is not None
    assert generate_texts(loaded, loaded_tok, prompts(loaded_tok)) == generate_texts(
        model, tokenizer, prompts(tokenizer)
    )


def test_built_in_names_load_from_the_cache(tiny_policy, tiny_cache_dir):
    model, tokenizer, device = load_policy("tiny", device="cpu", cache_dir=tiny_cache_dir)

    assert device == "cpu" and not model.training
    assert torch.equal(model.lm_head.weight, tiny_policy[0].lm_head.weight)
    assert tokenizer.padding_side == "left"


def test_dtype_can_be_asked_for(tiny_policy, tiny_cache_dir):
    model, _, _ = load_policy("tiny", device="cpu", cache_dir=tiny_cache_dir, dtype="bfloat16")

    assert model.dtype == torch.bfloat16


def test_missing_pad_token_falls_back_to_eos(tiny_policy):
    tokenizer = copy.deepcopy(tiny_policy[1])
    tokenizer.pad_token = None
    tokenizer.padding_side = "right"

    prepare_tokenizer(tokenizer)

    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.padding_side == "left"


def test_an_unknown_model_fails_without_the_network(tmp_path):
    with pytest.raises(OSError):
        load_policy("no-such-owner/no-such-model-xyz", device="cpu", cache_dir=tmp_path)


def test_devices_and_dtypes():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") in {"cuda", "mps", "cpu"}
    if not torch.cuda.is_available():
        assert resolve_device("auto") in {"mps", "cpu"}
    assert resolve_dtype("cpu") == torch.float32
    assert resolve_dtype("cpu", "bfloat16") == resolve_dtype("cpu", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_dtype("cpu", "float7")


def test_hardware_line():
    line = describe_hardware("cpu")

    assert re.fullmatch(r"cpu x\d+, \d+ GiB", line), line
