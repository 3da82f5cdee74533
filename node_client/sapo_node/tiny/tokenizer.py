"""A built-in model's own byte-level BPE tokenizer, trained on reasoning-gym text."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sapo_node.prompts import format_plain, format_target
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE, build_entries
from sapo_node.tiny.variants import TinyVariant

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def tokenizer_corpus(variant: TinyVariant) -> list[str]:
    """Prompt+target texts of reasoning-gym entries: mostly the easy catalogue, some full configs."""
    texts = []
    mix = ((EASY_CATALOGUE, variant.tokenizer_examples), (SAPO_CATALOGUE, variant.tokenizer_examples // 10))
    if variant.catalogue == "sapo":
        mix = ((SAPO_CATALOGUE, variant.tokenizer_examples), (EASY_CATALOGUE, variant.tokenizer_examples // 10))
    for catalogue, n in mix:
        for spec in catalogue.tasks:
            for entry in build_entries(spec, variant.tokenizer_seed, n):
                texts.append(format_plain(entry["question"]) + format_target(str(entry["answer"])))
    return texts


def train_tokenizer(variant: TinyVariant) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text round-trips) with <|endoftext|> as eos and <|pad|>."""
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if variant.split_digits:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=variant.vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tokenizer_corpus(variant), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=2048,
    )
