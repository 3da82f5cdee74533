"""The one prompt format: what the tiny model is warm-started on is what it is asked at generation."""

from __future__ import annotations

import copy

import pytest

from sapo_node.prompts import FEW_SHOT, SYSTEM_PROMPT, format_prompt, format_target
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE, build_entry, extract_answer, score_completion
from sapo_node.tiny.tokenizer import train_tokenizer
from sapo_node.tiny.variants import VARIANTS

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tokenizer(request):
    return train_tokenizer(VARIANTS[request.param])


def entries(catalogue=EASY_CATALOGUE, n=25, seed=321):
    return [(spec, build_entry(spec, seed, i)) for spec in catalogue.tasks for i in range(n)]


def test_plain_prompt_ends_with_the_answer_cue(tokenizer):
    question = "Calculate 4 - 1.\n"
    prompt = format_prompt(tokenizer, question)

    assert prompt == "Question: Calculate 4 - 1.\nAnswer:"
    assert format_target("3") == " <answer>3</answer>"


def test_prompt_and_target_tokenise_apart_as_together(tokenizer):
    """No merge across the boundary: the warm start and GRPO see the ids the model generates."""
    for spec, entry in entries() + entries(SAPO_CATALOGUE, n=3):
        prompt = format_prompt(tokenizer, entry["question"])
        target = format_target(str(entry["answer"]))
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]

        assert tokenizer(prompt + target, add_special_tokens=False)["input_ids"] == prompt_ids + target_ids, spec
        assert tokenizer.convert_ids_to_tokens(target_ids[0]).startswith("Ġ")  # the byte-level space


def test_the_warm_start_target_earns_full_reward():
    for spec, entry in entries(n=10):
        completion = format_target(str(entry["answer"]))

        assert extract_answer(completion) == str(entry["answer"])
        assert score_completion(spec, 321, entry, completion) == 1.0


def test_chat_template_gets_the_system_prompt_and_a_generation_prompt():
    tokenizer = copy.deepcopy(train_tokenizer(VARIANTS["tiny-mini"]))
    tokenizer.chat_template = CHATML

    prompt = format_prompt(tokenizer, "  Calculate 4 - 1.  ")

    shots = "".join(
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"
        for user, assistant in FEW_SHOT
    )
    assert prompt == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"{shots}"
        "<|im_start|>user\nCalculate 4 - 1.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert "<answer>" in SYSTEM_PROMPT
    assert format_prompt(tokenizer, "Calculate 4 - 1.", few_shot=False) == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nCalculate 4 - 1.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_every_worked_turn_ends_in_an_answer_the_verifiers_read():
    for _, assistant in FEW_SHOT:
        assert extract_answer(assistant) is not None and assistant.endswith("</answer>")
