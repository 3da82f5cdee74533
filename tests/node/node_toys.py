"""Throwaway tiny policies for the node tests: a Qwen2 model of a few thousand parameters with its
own quickly trained byte-level BPE tokenizer. Two recipes give two different tokenizers, for the
heterogeneous-swarm test. Built in well under a second; untrained (the tests that need a reward
signal build their groups by hand). And `collate`, the plain layout of a batch (each row its whole
prompt and completion) that the node's grouped layout and `completion_logprobs` are checked against."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sapo_node.grpo import Sequences
from sapo_node.prompts import format_plain, format_target
from sapo_node.tasks import EASY_CATALOGUE, build_entry
from sapo_node.tiny.model import build_model
from sapo_node.tiny.variants import VARIANTS

EOS, PAD = "<|endoftext|>", "<|pad|>"


@lru_cache(maxsize=4)
def _corpus() -> tuple[str, ...]:
    texts = []
    for spec in EASY_CATALOGUE.tasks:
        for index in range(40):
            entry = build_entry(spec, 5, index)
            texts.append(format_plain(entry["question"]) + format_target(str(entry["answer"])))
    return tuple(texts)


@lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int, split_digits: bool) -> str:
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        if split_digits
        else byte_level
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_corpus()), trainer=trainer)
    return tok.to_str()


def make_tokenizer(vocab_size: int = 400, split_digits: bool = False) -> PreTrainedTokenizerFast:
    tok = Tokenizer.from_str(_tokenizer_json(vocab_size, split_digits))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, padding_side="left")


def make_policy(variant: str = "a", seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer): variant "a" (BPE 400) or "b" (BPE 300 with single digits, wider model)."""
    tokenizer = make_tokenizer(400, False) if variant == "a" else make_tokenizer(300, True)
    hidden = 32 if variant == "a" else 48
    shape = replace(
        VARIANTS["tiny-mini"],
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
    )
    return build_model(shape, tokenizer, seed), tokenizer


def fake_load_policy(
    model: str, device: str = "auto", cache_dir: Any = None, dtype: Any = None
) -> tuple[Any, Any, str]:
    """Stands in for sapo_node.models.load_policy: "tiny" -> variant a, anything else -> variant b."""
    m, t = make_policy("a" if model == "tiny" else "b")
    return m, t, "cpu"


def collate(rows: list[tuple[list[int], list[int], float]], pad: int, device: Any) -> Sequences:
    """(prompt ids, completion ids, advantage) rows -> left-padded prompts, right-padded completions."""
    p_len = max(len(p) for p, _, _ in rows)
    t_len = max(max(len(c) for _, c, _ in rows), 1)
    ids, attn, cmask = [], [], []
    for prompt, completion, _ in rows:
        left, right = p_len - len(prompt), t_len - len(completion)
        ids.append([pad] * left + prompt + completion + [pad] * right)
        attn.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
        cmask.append([1] * len(completion) + [0] * right)
    return Sequences(
        input_ids=torch.tensor(ids, device=device),
        attention_mask=torch.tensor(attn, device=device),
        completion_mask=torch.tensor(cmask, device=device),
        advantages=torch.tensor([a for _, _, a in rows], dtype=torch.float32, device=device),
    )
