"""The recipes of the built-in models: tokenizer, architecture and warm start of each, by name."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class TinyVariant:
    """A recipe: tokenizer, architecture and warm start of one built-in model."""

    name: str
    #: Target vocabulary of the byte-level BPE tokenizer (256 bytes + special tokens + merges).
    vocab_size: int
    #: Split numbers into single digits before BPE (a different tokenizer from the same text).
    split_digits: bool
    #: Seed of the reasoning-gym questions the tokenizer is trained on, and how many per dataset.
    tokenizer_seed: int
    tokenizer_examples: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    #: Warm start: optimizer steps, examples per step, peak learning rate.
    steps: int
    batch_size: int
    lr: float
    #: Datasets of the easy catalogue the warm start teaches (empty: all of them). Variants that know
    #: different datasets give nodes different competences (the skill-transfer study).
    known: tuple[str, ...] = ()
    #: A second supervised phase after the warm start, on the same datasets: steps, peak learning rate,
    #: and the share of its targets given as the bare answer (" 7" instead of " <answer>7</answer>").
    #: The model keeps what it knows but uses the answer format unreliably, which GRPO can fix: a
    #: warm start that already answers in format leaves GRPO little it can find (docs/experiment.md).
    format_steps: int = 0
    format_lr: float = 0.0
    bare_share: float = 0.0
    #: The catalogue the tokenizer and the warm start draw from: easy, or sapo (the paper's nine tasks).
    catalogue: str = "easy"


VARIANTS: dict[str, TinyVariant] = {
    "tiny": TinyVariant(
        name="tiny",
        vocab_size=2048,
        split_digits=False,
        tokenizer_seed=11,
        tokenizer_examples=300,
        hidden_size=256,
        num_layers=6,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=704,
        steps=200,
        batch_size=32,
        lr=2e-3,
    ),
    "tiny-mini": TinyVariant(
        name="tiny-mini",
        vocab_size=1024,
        split_digits=True,
        tokenizer_seed=23,
        tokenizer_examples=200,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=384,
        steps=150,
        batch_size=32,
        lr=3e-3,
    ),
}

#: The architecture and tokenizer of tiny-mini with a longer warm start and a format phase: the
#: built-in model whose reward GRPO raises within tens of rounds (the `cpu-learn` preset).
_LEARN = dataclasses.replace(VARIANTS["tiny-mini"], steps=1000, format_steps=150, format_lr=1e-3, bare_share=0.8)
VARIANTS["tiny-learn"] = dataclasses.replace(_LEARN, name="tiny-learn")
# Two halves of the easy catalogue, one per variant: nodes that know different things (skill
# transfer). 600 steps over two datasets teach each of them more than tiny-learn's 1000 over four.
VARIANTS["tiny-learn-a"] = dataclasses.replace(
    _LEARN, name="tiny-learn-a", steps=600, known=("basic_arithmetic", "calendar_arithmetic")
)
VARIANTS["tiny-learn-b"] = dataclasses.replace(
    _LEARN, name="tiny-learn-b", steps=600, known=("base_conversion", "fraction_simplification")
)
#: tiny-learn with the format almost never used (95% of the format phase's targets bare): most of a
#: node's own groups score 0 in every completion at the start, so an informative group is rare and
#: one found elsewhere in the swarm is worth most (the `cpu-swarm` preset, docs/experiment.md).
VARIANTS["tiny-sparse"] = dataclasses.replace(_LEARN, name="tiny-sparse", bare_share=0.95)
#: A larger model for a GPU (about 26M parameters), built locally from the paper's nine tasks: the
#: `gpu-learn` preset, which needs no hub. Building it on a CPU takes hours; on a GPU minutes (not measured yet).
VARIANTS["small"] = TinyVariant(
    name="small",
    vocab_size=4096,
    split_digits=True,
    tokenizer_seed=31,
    tokenizer_examples=400,
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    intermediate_size=1408,
    steps=4000,
    batch_size=64,
    lr=1e-3,
    format_steps=300,
    format_lr=3e-4,
    bare_share=0.8,
    catalogue="sapo",
)


def get_variant(name: str) -> TinyVariant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown tiny variant {name!r}; choose from {sorted(VARIANTS)}") from None
