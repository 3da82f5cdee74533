"""The built-in tiny models: their tokenizers, the cache, reproducibility and partial accuracy."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
import tempfile
import threading

import pytest
import torch

from sapo_node.prompts import format_prompt
from sapo_node.tasks import (
    EASY_CATALOGUE,
    MAX_DRAWS,
    SAPO_CATALOGUE,
    TaskError,
    TaskSpec,
    build_entries,
    build_entry,
    build_first,
)
from sapo_node.tiny import cache
from sapo_node.tiny.batches import default_workers, supervised_batch
from sapo_node.tiny.cache import BUILD_INFO, build_info, load_tiny, tiny_path
from sapo_node.tiny.cli import main
from sapo_node.tiny.evaluation import evaluate
from sapo_node.tiny.generation import generate_texts
from sapo_node.tiny.model import build_model, count_params
from sapo_node.tiny.tokenizer import train_tokenizer
from sapo_node.tiny.variants import VARIANTS
from sapo_node.tiny.warm_start import TRAIN_SEED, known_catalogue, warm_start


@pytest.fixture(scope="module")
def tokenizers():
    return {name: train_tokenizer(variant) for name, variant in VARIANTS.items()}


def test_tokenizers_round_trip_reasoning_gym_text(tokenizers):
    texts = [
        build_entry(spec, 77, i)["question"] for spec in EASY_CATALOGUE.tasks + SAPO_CATALOGUE.tasks for i in range(3)
    ]
    texts += ["  tabs\tand\nnewlines ", "ünïcödé ∑ 😀 <answer>-4.5</answer>"]  # bytes it never saw
    for tokenizer in tokenizers.values():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert tokenizer.decode(ids) == text


def test_variants_have_their_own_tokenizers_with_eos_and_pad(tokenizers):
    tiny_tok, mini_tok = tokenizers["tiny"], tokenizers["tiny-mini"]

    assert tiny_tok.get_vocab() != mini_tok.get_vocab()
    assert 1000 <= len(mini_tok) < len(tiny_tok) <= 2048
    for tokenizer in tokenizers.values():
        assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
        assert tokenizer.eos_token_id != tokenizer.pad_token_id
        assert tokenizer.padding_side == "left"


def test_variant_sizes(tokenizers):
    assert 4_000_000 <= count_params(build_model(VARIANTS["tiny"], tokenizers["tiny"], 0)) <= 6_000_000
    assert 700_000 <= count_params(build_model(VARIANTS["tiny-mini"], tokenizers["tiny-mini"], 0)) <= 1_300_000


def test_unknown_variant_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tiny variant"):
        load_tiny("huge", cache_dir=tmp_path)


def test_build_is_reproducible_from_the_seed(tmp_path):
    first, first_tok = load_tiny("tiny-mini", cache_dir=tmp_path / "a", steps=3, progress=False)
    again, again_tok = load_tiny("tiny-mini", cache_dir=tmp_path / "b", steps=3, progress=False)
    other, _ = load_tiny("tiny-mini", cache_dir=tmp_path / "a", seed=1, steps=3, progress=False)

    assert first_tok.get_vocab() == again_tok.get_vocab()
    same = first.state_dict(), again.state_dict()
    assert all(torch.equal(same[0][k], same[1][k]) for k in same[0])
    assert not torch.equal(first.model.embed_tokens.weight, other.model.embed_tokens.weight)
    assert tiny_path("tiny-mini", tmp_path, seed=0, steps=3) != tiny_path("tiny-mini", tmp_path, seed=1, steps=3)


def test_second_load_reads_the_cache_without_rebuilding(tiny_policy, tiny_cache_dir, monkeypatch):
    path = tiny_path("tiny", tiny_cache_dir)
    marker = path / BUILD_INFO
    built = marker.stat().st_mtime_ns
    monkeypatch.setattr(cache, "build_tiny", lambda *a, **k: pytest.fail("rebuilt a cached model"))

    model, tokenizer = load_tiny("tiny", cache_dir=tiny_cache_dir, progress=False)

    assert marker.stat().st_mtime_ns == built
    assert build_info(path)["params"] == count_params(model)
    assert torch.equal(model.lm_head.weight, tiny_policy[0].lm_head.weight)
    assert tokenizer.get_vocab() == tiny_policy[1].get_vocab()


def test_concurrent_builds_of_one_recipe_build_once(tmp_path, monkeypatch):
    calls = []
    real_build = cache.build_tiny
    monkeypatch.setattr(cache, "build_tiny", lambda *a, **k: calls.append(1) or real_build(*a, **k))
    results = []

    def load() -> None:
        results.append(load_tiny("tiny-mini", cache_dir=tmp_path, steps=2, progress=False))

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(calls) == 1 and len(results) == 2
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [
        tiny_path("tiny-mini", tmp_path, steps=2).name
    ]


def test_warm_start_gives_partial_accuracy(tiny_policy):
    """GRPO needs groups with some right and some wrong answers: neither 0 nor 1 on held-out questions."""
    model, tokenizer = tiny_policy

    greedy = evaluate(model, tokenizer, n=64)

    assert any(0 < score < 1 for score in greedy.values()), greedy
    assert sum(greedy.values()) / len(greedy) > 0.05, greedy


def test_warm_started_completions_use_the_answer_tags(tiny_policy):
    model, tokenizer = tiny_policy
    prompts = [
        format_prompt(tokenizer, build_entry(spec, 4242, i)["question"])
        for spec in EASY_CATALOGUE.tasks
        for i in range(4)
    ]

    completions = generate_texts(model, tokenizer, prompts, temperature=1.0, num_return_sequences=2)

    tagged = [c for c in completions if c.startswith(" <answer>") and c.endswith("</answer>")]
    assert len(tagged) >= 0.9 * len(completions), completions


@pytest.fixture
def keep_threads():
    """The command sets torch's threads for the process; the tests after it get theirs back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_command_line_prints_an_accuracy_table(tmp_path, capsys, keep_threads):
    main(["--variant", "tiny-mini", "--steps", "2", "--cache-dir", str(tmp_path), "--eval", "-n", "2"])

    out = capsys.readouterr().out
    assert "params" in out
    for spec in EASY_CATALOGUE.tasks:
        assert spec.dataset in out
    info = json.loads((tiny_path("tiny-mini", tmp_path, steps=2) / BUILD_INFO).read_text())
    assert info["recipe"]["variant"]["steps"] == 2


def test_command_line_builds_on_the_threads_it_is_given(tmp_path, capsys, keep_threads):
    main(["--variant", "tiny-mini", "--steps", "2", "--cache-dir", str(tmp_path), "--threads", "1"])
    assert "on 1 threads)" in capsys.readouterr().out
    assert json.loads((tiny_path("tiny-mini", tmp_path, steps=2) / BUILD_INFO).read_text())["torch_threads"] == 1
    with pytest.raises(SystemExit):
        main(["--variant", "tiny-mini", "--steps", "2", "--cache-dir", str(tmp_path), "--threads", "0"])
    assert "--threads must be at least 1" in capsys.readouterr().err


# ---------------------------------------------------------------------------- warm-start recipes


def test_recipes_of_the_first_builds_keep_their_cache_folders(tmp_path):
    # Fields added to the recipe later must not move tiny's and tiny-mini's caches (a rebuild costs minutes).
    assert tiny_path("tiny", tmp_path).name == "tiny-9736bab04021"
    assert tiny_path("tiny-mini", tmp_path).name == "tiny-mini-2eaa4abc96d7"
    learn = {
        tiny_path(name, tmp_path) for name in ("tiny-learn", "tiny-learn-a", "tiny-learn-b", "tiny-sparse", "small")
    }
    assert len(learn) == 5


def test_bare_targets_drop_the_answer_tags_and_keep_the_answer(tokenizers):
    tokenizer = tokenizers["tiny-mini"]
    entry = build_entry(EASY_CATALOGUE.get("basic_arithmetic"), 5, 1)
    input_ids, _, labels = supervised_batch(tokenizer, [entry, entry], bare=[False, True])
    tagged, bare = (tokenizer.decode([t for t in row if t >= 0]) for row in labels.tolist())
    assert tagged == f" <answer>{entry['answer']}</answer><|endoftext|>"
    assert bare == f" {entry['answer']}<|endoftext|>"


def test_a_variant_knows_only_its_datasets():
    a, b = (known_catalogue(VARIANTS[name]).datasets for name in ("tiny-learn-a", "tiny-learn-b"))
    assert set(a).isdisjoint(b) and set(a) | set(b) == set(EASY_CATALOGUE.datasets)
    assert known_catalogue(VARIANTS["tiny-learn"]).datasets == EASY_CATALOGUE.datasets


def test_a_format_phase_build_records_its_recipe(tmp_path, monkeypatch):
    quick = dataclasses.replace(VARIANTS["tiny-learn-a"], steps=2, format_steps=2, batch_size=4)
    monkeypatch.setitem(VARIANTS, "tiny-learn-a", quick)
    load_tiny("tiny-learn-a", cache_dir=tmp_path, progress=False)
    info = build_info(tiny_path("tiny-learn-a", tmp_path))
    variant = info["recipe"]["variant"]
    assert (variant["format_steps"], variant["bare_share"], variant["known"]) == (
        2,
        0.8,
        ["basic_arithmetic", "calendar_arithmetic"],
    )
    assert info["format_seconds"] > 0


def test_the_gpu_model_builds_from_the_papers_tasks_with_no_hub(tmp_path, monkeypatch):
    # "small" at a tiny size, on the CPU: the same code path the gpu-learn preset runs on a GPU.
    shrunk = dataclasses.replace(
        VARIANTS["small"],
        vocab_size=600,
        tokenizer_examples=6,
        hidden_size=32,
        num_layers=1,
        intermediate_size=64,
        steps=2,
        format_steps=1,
        batch_size=2,
    )
    monkeypatch.setitem(VARIANTS, "small", shrunk)
    model, tokenizer = load_tiny("small", cache_dir=tmp_path, progress=False, device="cpu")
    info = build_info(tiny_path("small", tmp_path))
    assert info["recipe"]["catalogue"]["name"] == "sapo" and info["device"] == "cpu"
    entry = build_entry(SAPO_CATALOGUE.get("arc_1d"), 3, 0)
    (completion,) = generate_texts(model, tokenizer, [format_prompt(tokenizer, entry["question"])], max_new_tokens=4)
    assert isinstance(completion, str)
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.slow
def test_the_gpu_models_warm_start_passes_an_index_reasoning_gym_cannot_build(tmp_path):
    # The `small` recipe's own draws (seed, batch of 64, the nine tasks in turn) reach, at step 94, a
    # decimal_arithmetic index that divides by zero; the warm start must draw another one, as the
    # sampler does. Toy width, so the 96 steps are the entry draws and little else.
    toy = dataclasses.replace(
        VARIANTS["small"],
        vocab_size=600,
        tokenizer_examples=6,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
    )
    spec = SAPO_CATALOGUE.get("decimal_arithmetic")
    with pytest.raises(TaskError, match="275922209"):
        build_entry(spec, TRAIN_SEED, 275922209)
    tokenizer = train_tokenizer(toy)
    model = build_model(toy, tokenizer, seed=0)
    loss = warm_start(model, tokenizer, toy, seed=0, steps=96, catalogue=SAPO_CATALOGUE, progress=False)
    assert loss == loss  # a finite loss: every step ran


def test_build_first_skips_indices_that_cannot_be_built_and_gives_up_on_a_spec_that_builds_nothing():
    spec = SAPO_CATALOGUE.get("decimal_arithmetic")
    indices = iter([275922209, 7, 8])
    assert build_first(spec, TRAIN_SEED, indices) == (7, build_entry(spec, TRAIN_SEED, 7))
    assert build_first(spec, TRAIN_SEED, indices)[0] == 8  # callers sharing an iterator get the next one
    with pytest.raises(TaskError, match="cannot build dataset"):  # not an index problem: no redraw hides it
        build_first(TaskSpec("no_such_task", {}), 1, itertools.count())
    with pytest.raises(RuntimeError, match=f"{MAX_DRAWS} indices"):
        build_first(spec, TRAIN_SEED, itertools.repeat(275922209))
    assert [e["question"] for e in build_entries(spec, 3, 2, start=5)] == [
        build_entry(spec, 3, i)["question"] for i in (5, 6)
    ]


@pytest.mark.slow
def test_entries_built_in_worker_processes_give_the_same_weights(tmp_path):
    # A GPU build makes its batches in processes ahead of training; the model must not depend on it.
    quick = dataclasses.replace(VARIANTS["tiny-mini"], tokenizer_examples=10, steps=3, batch_size=4)
    tokenizer = train_tokenizer(quick)
    weights = []
    for workers in (0, 2):
        model = build_model(quick, tokenizer, seed=0)
        warm_start(model, tokenizer, quick, seed=0, steps=3, progress=False, workers=workers)
        weights.append(model.state_dict())
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert default_workers("cpu") == 0 and default_workers("cuda") >= 0


@pytest.mark.slow
def test_a_worker_that_cannot_start_breaks_the_build_at_once():
    # A spawned worker re-imports the parent's main program, which a program read from stdin does not
    # have as a file: the build must stop with BrokenProcessPool, not start replacement workers until
    # the caller's time is spent.
    program = (
        "import time\n"
        "from concurrent.futures.process import BrokenProcessPool\n"
        "from sapo_node.tiny.batches import batch_builder\n"
        "from sapo_node.tasks import TaskSpec\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    with batch_builder(2) as build:\n"
        "        list(build(iter([(TaskSpec('chain_sum', {}), 1, [0, 1], None)] * 4)))\n"
        "except BrokenProcessPool:\n"
        "    print('broken after', time.monotonic() - started)\n"
    )
    done = subprocess.run(
        [sys.executable, "-"], input=program, capture_output=True, text=True, timeout=120, cwd=tempfile.gettempdir()
    )
    assert done.stdout.startswith("broken after"), done.stdout + done.stderr[-2000:]
