"""Step 2 of a round: G completions for each of B prompts, sampled together with a KV cache.

A round's B*G rows share only B distinct prompts, so each distinct prompt goes through the model
once (together) and its key/value cache is then copied to its G rows: the prompt forward pass, most
of a round's generation work when answers are short, costs B rows instead of B*G. What the B prompts
share at their start (a chat model's system message and worked turns: 163 of SmolLM2's ~190 tokens)
goes through once for all of them (sapo_node.shared_prefix). The decode loop feeds one token per
still-running row and drops rows from the batch (and their cache) as they reach a stop token, so no
compute goes to rows that have finished; it ends when every row has stopped or after
`max_new_tokens`. All of it runs under `torch.inference_mode`.

Sampling is plain softmax sampling at `temperature` from the policy's own logits, with no
top-k/top-p, repetition penalty or other processor a model's generation_config may ask for, so the
samples follow the distribution the GRPO loss assumes. It is an inverse-CDF draw from a random
stream anyone holding the completion's key can recompute (`sapo_node.proof`, docs/protocol.md,
"Sampling"): token t of a completion with key K is, with u = proof.uniforms(K, n)[t],
p = softmax(logits / temperature) in float32 with the refused tokens at -inf, cdf = cumsum(p) in
float64 in token-id order, the first id whose cdf exceeds u * cdf[-1]. A row's draw reads only its
own logits and its own stream, so its tokens do not depend on which other rows share its batch or
are still running, and a verifier holding the weights replays them teacher-forced
(sapo_node.audit). The key of a group made under a server challenge is
proof.completion_key(challenge, ...); without one the node draws a key from torch's generator, so
there is one sampler. Each sampled token's log-probability, log p[token] of that float32
distribution, is kept with it (`Generated.logprobs`).

On a CUDA device the same draws run on a static path (`_sample_rows_static`): a key/value cache of
fixed shape kept between rounds, every row fed at every step (a row that stopped is masked: its
tokens after the stop are ignored), the decode step captured
in a CUDA graph by torch.compile(mode="reduce-overhead"), the rows' streams moved to the device
once as one (rows, max_new_tokens) float64 tensor, and one host synchronisation per round instead
of one per token. What it costs on a CPU (B*G rows for every step, a prompt pass per row) is what
the dropping loop saves, so the CPU keeps that loop. `temperature` 0 is greedy (argmax) on both;
its recorded log-probability is then the policy's at temperature 1, log_softmax(logits)[token].

No completion holds a character the pool refuses or its moderation counts as non-printable (NUL,
other control characters, zero-width and bidi marks, a lone surrogate), nor a byte fragment of
one: a token whose text alone is not whole printable characters (`refused_tokens`: byte-level BPE
keeps every byte as a token, control bytes included, and a policy whose softmax has flattened
draws them) is never drawn, so the text is a concatenation of whole printable characters. Its
logit is set to -inf before the draw: the draw follows the policy's softmax over the other tokens,
which a warm model gives all but a negligible share of its mass.

The update's forward pass recomputes the log-probs of the policy before the update
(sapo_node.grpo); the sampled ones go on the wire with the group's proof.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from sapo_node import proof, protocol
from sapo_node.prompts import has_chat_template
from sapo_node.shared_prefix import prompt_layout, prompt_pass, returned_cache, with_cache


@dataclass
class Generated:
    """The G completions of one prompt, as token ids (ending in EOS when the model stopped) and text,
    with each sampled token's log-probability (one float per id, the stop included) and each
    completion's sampling key (proof.uniforms' key: its tokens replay from it)."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    truncated: list[bool]
    logprobs: list[list[float]] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for ids in self.completion_ids)


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a formatted prompt. A chat template already holds its special tokens."""
    return list(tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"])


def stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """Token ids that end a completion: the tokenizer's EOS and the model's generation EOS ids."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


#: Characters no completion holds, as inclusive code point ranges: the non-printable ones (what the
#: moderation's characters rule counts: protocol.NONPRINTABLE), lone surrogates (text the pool cannot
#: store as UTF-8) and U+FFFD (what a byte fragment decodes to).
REFUSED_CHARACTERS = (*protocol.NONPRINTABLE, (0xD800, 0xDFFF), (0xFFFD, 0xFFFD))
_REFUSED = re.compile("[" + "".join(f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in REFUSED_CHARACTERS) + "]")


def printable(text: str) -> bool:
    """Whether `text` holds none of REFUSED_CHARACTERS."""
    return _REFUSED.search(text) is None


#: Per tokenizer: its refused-token masks by (vocabulary size of the logits, device).
_REFUSED_MASKS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str], torch.Tensor]] = weakref.WeakKeyDictionary()


def refused_tokens(tokenizer: Any, vocab: int, device: Any, stops: Collection[int] = ()) -> torch.Tensor:
    """(V,) bool: the token ids the sampler never draws: those whose text alone is not printable
    (a control byte, or a fragment of a character: U+FFFD) and ids past the tokenizer's vocabulary.
    Special tokens decode to nothing and stay allowed; so do `stops`. Built once per tokenizer,
    vocabulary size and device."""
    masks = _REFUSED_MASKS.setdefault(tokenizer, {})
    key = (vocab, str(device))
    if key not in masks:
        known = min(vocab, len(tokenizer))
        texts = tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=True)
        refused = [not printable(text) for text in texts] + [True] * (vocab - known)
        for i in stops:
            if 0 <= i < vocab:
                refused[i] = False
        masks[key] = torch.tensor(refused, dtype=torch.bool, device=device)
    return masks[key]


def sample_tokens(
    logits: torch.Tensor, u: torch.Tensor | None, temperature: float, refused: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, V) logits and (N,) float64 uniforms in [0, 1) -> (N,) token ids drawn from
    softmax(logits / temperature) over the tokens not `refused` ((V,) bool), and their (N,) float32
    log-probabilities under that softmax. temperature 0 (u unused) is the argmax, with the
    log-probability at temperature 1.

    Inverse CDF: p in float32, cdf = cumsum(p) in float64 in token-id order, the first id whose cdf
    exceeds u * cdf[-1] (a token of p = 0 never is)."""
    logits = logits.float()
    if refused is not None:
        logits = logits.masked_fill(refused, -torch.inf)
    if temperature == 0:
        ids = torch.argmax(logits, dim=-1)
        return ids, torch.log_softmax(logits, dim=-1).gather(-1, ids[:, None]).squeeze(1)
    scaled = logits / temperature
    cdf = torch.cumsum(torch.softmax(scaled, dim=-1), dim=-1, dtype=torch.float64)  # (N, V)
    total = cdf[:, -1:]  # (N, 1)
    # u < 1, but u * total may round up to total: keep the target below it, inside the last interval.
    target = torch.minimum(u[:, None].to(torch.float64) * total, torch.nextafter(total, torch.zeros_like(total)))
    ids = torch.searchsorted(cdf, target, right=True).squeeze(1)  # (N,)
    return ids, torch.log_softmax(scaled, dim=-1).gather(-1, ids[:, None]).squeeze(1)


def random_keys(prompts: int, generations: int) -> list[list[bytes]]:
    """Sampling keys for completions no challenge names, drawn from torch's generator so that a run
    seeded with torch.manual_seed (a node's --seed) draws the same completions again."""
    raw = torch.randint(0, 256, (prompts, generations, 32), dtype=torch.uint8).tolist()
    return [[bytes(key) for key in row] for row in raw]


def row_uniforms(keys: Sequence[bytes], steps: int, device: Any) -> torch.Tensor:
    """(N, steps) float64: each row's stream (proof.uniforms of its key), moved to the device once."""
    return torch.tensor([proof.uniforms(key, steps) for key in keys], dtype=torch.float64, device=device)


@torch.inference_mode()
def generate_groups(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    generations: int,
    max_new_tokens: int,
    temperature: float,
    batch_size: int = 0,
    static: bool | None = None,
    compile: str | None = "auto",
    keys: list[list[bytes]] | None = None,
) -> list[Generated]:
    """`generations` sampled completions for each prompt; batch_size 0 = all rows in one batch.

    keys[b][k] is the sampling key of prompt b's completion k (proof.completion_key under a server
    challenge); None draws a 32-byte key per completion from torch's generator, so a run seeded with
    torch.manual_seed (a node's --seed, a held-out evaluation) draws the same completions again.

    `static` chooses the static path (None: on CUDA); `compile` how its decode step is compiled:
    "auto" (reduce-overhead on CUDA, none elsewhere), "reduce-overhead", "eager" (traced whole, run
    eagerly: checks the step captures with no graph break) or None."""
    if temperature < 0:
        raise ValueError("temperature must be >= 0 (0: greedy)")
    device = next(model.parameters()).device
    if static is None:
        static = device.type == "cuda"
    if compile == "auto":
        compile = "reduce-overhead" if device.type == "cuda" else None
    if keys is None:
        keys = random_keys(len(prompts), generations)
    if len(keys) != len(prompts) or any(len(row) != generations for row in keys):
        raise ValueError("keys must hold `generations` keys for each prompt")
    row_keys = [key for row in keys for key in row]  # prompt-major, as the rows
    prompt_ids = [encode_prompt(tokenizer, p) for p in prompts]
    owners = [b for b in range(len(prompts)) for _ in range(generations)]  # B*G rows, prompt-major
    step = batch_size if batch_size > 0 else len(owners)
    stops = stop_ids(model, tokenizer)
    refused = refused_tokens(tokenizer, model.config.vocab_size, device, stops)
    model.eval()

    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    truncated: list[bool] = []
    for start in range(0, len(owners), step):
        chunk = owners[start : start + step]
        u = row_uniforms(row_keys[start : start + step], max_new_tokens, device)
        if static:
            rows, lps, ended = _sample_rows_static(
                model, prompt_ids, chunk, stops, pad_id(tokenizer), max_new_tokens, temperature, compile, refused, u
            )
        else:
            rows, lps, ended = _sample_rows(
                model, prompt_ids, chunk, stops, pad_id(tokenizer), max_new_tokens, temperature, refused, u
            )
        completions += rows
        logprobs += lps
        truncated += [not e for e in ended]

    groups = []
    for b, ids in enumerate(prompt_ids):
        rows_b = slice(b * generations, (b + 1) * generations)
        comp = completions[rows_b]
        texts = [tokenizer.decode([t for t in c if t not in stops], skip_special_tokens=True) for c in comp]
        groups.append(Generated(ids, comp, texts, truncated[rows_b], logprobs[rows_b], row_keys[rows_b]))
    return groups


def _sample_rows(
    model: Any,
    prompt_ids: list[list[int]],
    owners: list[int],
    stops: set[int],
    pad: int,
    max_new_tokens: int,
    temperature: float,
    refused: torch.Tensor | None,
    u: torch.Tensor,
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """One completion per entry of `owners` (an index into `prompt_ids`), row i drawn with the
    uniforms u[i] ((N, T) float64): its ids (up to and including the first stop id), their
    log-probabilities and whether it stopped; no id of `refused` ((V,) bool) is drawn."""
    device = next(model.parameters()).device
    distinct = sorted(set(owners))
    # The distinct prompts' shared beginning (a chat model's system message and worked turns) once,
    # then each prompt's own tokens (sapo_node.shared_prefix).
    input_ids, prompt_mask, shared = prompt_layout([prompt_ids[b] for b in distinct], pad, device)  # (K, P)
    width = input_ids.shape[1]
    out = prompt_pass(model, input_ids, prompt_mask, shared, logits_to_keep=1)
    owner = torch.tensor([distinct.index(b) for b in owners], device=device)  # (N,) row -> its prompt
    cache = returned_cache(out)
    cache.reorder_cache(owner)  # each distinct prompt's keys/values copied to its rows
    logits = out.logits[:, -1][owner]  # (N, V)

    n = len(owners)
    # The attention mask of every row over prompt + completion, and each row's next position.
    mask = torch.ones((n, width + max_new_tokens), dtype=prompt_mask.dtype, device=device)
    mask[:, :width] = prompt_mask[owner]
    position = prompt_mask.sum(-1)[owner]  # (N,)
    stop_tensor = torch.tensor(sorted(stops), device=device) if stops else None
    tokens = torch.full((n, max_new_tokens), pad, device=device)  # (N, T)
    logprobs = torch.zeros((n, max_new_tokens), device=device)  # (N, T) float32
    lengths = torch.full((n,), max_new_tokens, device=device)  # (N,) tokens kept per row
    ended = torch.zeros(n, dtype=torch.bool, device=device)
    active = torch.arange(n, device=device)  # rows still in the batch
    for t in range(max_new_tokens):
        next_ids, next_logprobs = sample_tokens(logits, u[active, t], temperature, refused)  # (A,)
        tokens[active, t] = next_ids
        logprobs[active, t] = next_logprobs
        stopped = torch.isin(next_ids, stop_tensor) if stop_tensor is not None else torch.zeros_like(active, dtype=bool)
        if bool(stopped.any()):
            lengths[active[stopped]] = t + 1
            ended[active[stopped]] = True
            keep = (~stopped).nonzero().squeeze(1)  # positions in the current batch
            if keep.numel() == 0:
                break
            cache.reorder_cache(keep)
            active, next_ids = active[keep], next_ids[keep]
        if t + 1 == max_new_tokens:
            break
        out = model(
            input_ids=next_ids[:, None],
            attention_mask=mask[active, : width + t + 1],
            position_ids=(position[active] + t)[:, None],
            use_cache=True,
            **with_cache(model, cache),
        )
        cache = returned_cache(out)
        logits = out.logits[:, -1]  # (A, V)
    lengths_list = lengths.tolist()
    rows = [row[:length] for row, length in zip(tokens.tolist(), lengths_list, strict=True)]
    lps = [row[:length] for row, length in zip(logprobs.tolist(), lengths_list, strict=True)]
    return rows, lps, ended.tolist()


#: The static cache's length is rounded up to a multiple of this, so rounds whose prompts differ a
#: little in length reuse one cache and one captured graph.
STATIC_LENGTH_STEP = 64


def _sample_rows_static(
    model: Any,
    prompt_ids: list[list[int]],
    owners: list[int],
    stops: set[int],
    pad: int,
    max_new_tokens: int,
    temperature: float,
    compile: str | None,
    refused: torch.Tensor | None,
    u: torch.Tensor,
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """`_sample_rows` with fixed shapes: the same tokens for the same uniforms, one host sync at the end."""
    device = next(model.parameters()).device
    n = len(owners)
    width = max(len(prompt_ids[b]) for b in owners)
    length = -(-(width + max_new_tokens) // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP
    cache = _static_cache(model, n, length)
    input_ids = torch.tensor([[pad] * (width - len(prompt_ids[b])) + prompt_ids[b] for b in owners], device=device)
    prompt_mask = torch.tensor(
        [[0] * (width - len(prompt_ids[b])) + [1] * len(prompt_ids[b]) for b in owners], device=device
    )  # (N, P)
    mask = torch.zeros((n, length), dtype=prompt_mask.dtype, device=device)  # (N, L): what each row attends to
    mask[:, :width] = prompt_mask
    position = prompt_mask.sum(-1)  # (N,) each row's next position
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        **with_cache(model, cache),
        cache_position=torch.arange(width, device=device),
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1]  # (N, V)
    step = _decode_step(model, compile)
    cache_positions = torch.arange(width, width + max_new_tokens, device=device)  # (T,)
    stop_tensor = torch.tensor(sorted(stops) or [-1], device=device)
    tokens = torch.full((n, max_new_tokens), pad, device=device)  # (N, T)
    logprobs = torch.zeros((n, max_new_tokens), device=device)  # (N, T) float32
    lengths = torch.full((n,), max_new_tokens, device=device)  # (N,)
    ended = torch.zeros(n, dtype=torch.bool, device=device)  # (N,)
    for t in range(max_new_tokens):
        next_ids, next_logprobs = sample_tokens(logits, u[:, t], temperature, refused)  # (N,)
        next_ids = torch.where(ended, pad, next_ids)  # a stopped row is fed padding from here on
        tokens[:, t] = next_ids
        logprobs[:, t] = next_logprobs
        stopped = torch.isin(next_ids, stop_tensor) & ~ended
        lengths = torch.where(stopped, t + 1, lengths)
        ended = ended | stopped
        if t + 1 == max_new_tokens:
            break
        mask[:, width + t] = 1
        logits = step(
            input_ids=next_ids[:, None],
            attention_mask=mask,
            position_ids=(position + t)[:, None],
            **with_cache(model, cache),
            cache_position=cache_positions[t : t + 1],
            use_cache=True,
        ).logits[:, -1]
    # The round's one host synchronisation.
    lengths_list = lengths.tolist()
    rows = [row[:k] for row, k in zip(tokens.tolist(), lengths_list, strict=True)]
    lps = [row[:k] for row, k in zip(logprobs.tolist(), lengths_list, strict=True)]
    return rows, lps, ended.tolist()


#: Per model: its static caches by (rows, length), and its compiled decode steps by mode. Kept between
#: rounds: a new cache would move the tensors a captured graph reads and writes.
_STATIC: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()


def _static_cache(model: Any, rows: int, length: int) -> Any:
    from transformers import StaticCache

    kept = _STATIC.setdefault(model, {})
    key = ("cache", rows, length, next(model.parameters()).dtype)
    if key not in kept:
        kept[key] = StaticCache(config=model.config, max_cache_len=length)
    cache = kept[key]
    cache.reset()
    return cache


def _decode_step(model: Any, compile: str | None) -> Any:
    """The model's forward for one decode step: as is, or compiled whole (fullgraph) by torch.compile."""
    if compile is None:
        return model
    kept = _STATIC.setdefault(model, {})
    key = ("step", compile)
    if key not in kept:
        if compile == "eager":
            kept[key] = torch.compile(model.forward, backend="eager", fullgraph=True, dynamic=False)
        else:
            kept[key] = torch.compile(model.forward, mode=compile, fullgraph=True, dynamic=False)
    return kept[key]
