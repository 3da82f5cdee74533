"""A built-in model's network: a Qwen2-architecture model built from its variant's config."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from sapo_node.tiny.variants import TinyVariant


def build_model(variant: TinyVariant, tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=variant.hidden_size,
        intermediate_size=variant.intermediate_size,
        num_hidden_layers=variant.num_layers,
        num_attention_heads=variant.num_heads,
        num_key_value_heads=variant.num_kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
