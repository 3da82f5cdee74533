"""The sandbox that scores unreviewed datasets: real reasoning-gym scorers, real worker processes.

spiral_matrix is a reasoning-gym dataset outside both catalogues whose scorer calls `eval(answer)`
(as binary_matrix's does); reasoning-gym's own propositional_logic scorer (not ours) is the slow
one. Both reach the sandbox the way they would in production: a catalogue naming a dataset nobody
reviewed, or a reviewed dataset whose code changed (the reviewed hash no longer matches).
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest
from node_toys import make_policy

from sapo_node.assemble import assemble
from sapo_node.datasets import datasets_forget
from sapo_node.groups import Group
from sapo_node.prompts import format_prompt
from sapo_node.tasks import (
    CATALOGUES,
    Catalogue,
    ScoringTimeout,
    TaskRef,
    TaskSpec,
    build_entry,
    dataset_for,
    score_completions,
)
from sapo_node.verifiers import vetted
from sapo_node.verifiers.sandbox import ScoringSandbox

SPIRAL = TaskSpec("spiral_matrix", {})
LOGIC = CATALOGUES["sapo"].get("propositional_logic")


def touch(marker) -> str:
    return f"<answer>__import__('pathlib').Path({str(marker)!r}).touch()</answer>"


@pytest.fixture
def logic_changed(monkeypatch):
    """As if reasoning-gym's propositional_logic scorer had changed since review and ours were gone:
    the dataset is scored by reasoning-gym's code, in the sandbox."""
    monkeypatch.setitem(
        vetted.VERIFIERS, "propositional_logic", vetted.Verifier(1024, reviewed={"score_answer": "0" * 16})
    )
    monkeypatch.setattr(vetted, "_reviewed_classes", {})


def test_the_eval_payload_is_live_outside_and_refused_inside_the_sandbox(tmp_path):
    entry = build_entry(SPIRAL, 1, 2)
    outside = tmp_path / "outside"
    script = (
        "import reasoning_gym, sys\n"
        "ds = reasoning_gym.create_dataset('spiral_matrix', size=10, seed=1)\n"
        "ds.score_answer(sys.argv[1], ds[2])\n"
    )
    payload = f"__import__('pathlib').Path({str(outside)!r}).touch()"
    subprocess.run([sys.executable, "-c", script, payload], check=True, timeout=120)
    assert outside.exists()  # reasoning-gym's scorer runs node text

    inside = tmp_path / "inside"
    honest = f"<answer>{entry['answer']}</answer>"
    scores = score_completions(SPIRAL, 1, entry, [honest, touch(inside), "<answer>9**9**9</answer>"])
    assert scores == [dataset_for(SPIRAL, 1).score_answer(entry["answer"], entry), 0.0, 0.0] == [1.0, 0.0, 0.0]
    assert not inside.exists()


def test_a_runaway_scorer_is_killed_and_only_its_answer_loses():
    sandbox = ScoringSandbox(workers=1, seconds_per_answer=0.3)
    try:
        entry = build_entry(LOGIC, 5, 11)
        ds = dataset_for(LOGIC, 5)
        answers = ["P", "¬" * 900 + "P", "Q ∨ P"]  # the middle one costs reasoning-gym about 2 s
        start = time.perf_counter()
        scores = sandbox.score("propositional_logic", LOGIC.config, 5, entry, answers)
        elapsed = time.perf_counter() - start
        assert scores == [ds.score_answer("P", entry), None, ds.score_answer("Q ∨ P", entry)]
        assert sandbox.killed == 1
        assert elapsed < 1.2 + 2.0  # its 0.3 s, plus starting two workers on a loaded machine
        # The killed worker was replaced: the next batch is scored as usual.
        assert sandbox.score("propositional_logic", LOGIC.config, 5, entry, ["P"]) == [ds.score_answer("P", entry)]
    finally:
        sandbox.close()


def test_a_scorer_that_eats_memory_gets_memory_error_and_scores_zero():
    """reasoning-gym's truth table over 40 atoms asks for 2^40 dicts: RLIMIT_AS stops it."""
    sandbox = ScoringSandbox(workers=1, seconds_per_answer=30, memory_bytes=64 * 2**20)
    try:
        entry = build_entry(LOGIC, 5, 11)
        atoms = " ∧ ".join(f"a{i}" for i in range(40))
        start = time.perf_counter()
        assert sandbox.score("propositional_logic", LOGIC.config, 5, entry, [atoms, "P"]) == [
            0.0,
            dataset_for(LOGIC, 5).score_answer("P", entry),
        ]
        assert time.perf_counter() - start < 20 and sandbox.killed == 0
    finally:
        sandbox.close()


def _score_count_primes_filling_a_worker(**sandbox_args) -> int:
    """Each count_primes seed here is a 20 MB sieve a worker keeps, and each entry lists its primes: a
    few thousand, then 160,259 (5 MB in the worker). Whatever room the worker's bound leaves it when
    that last batch arrives (swept in 2 MiB steps), every batch is scored right; returns the workers
    lost."""
    spec = TaskSpec("count_primes", {"min_n": 1, "max_n": 2_500_000})
    # (seed, index): entries of 737, 3,614, 2,832 and 160,259 primes
    entries = [
        (seed, build_entry(spec, seed, index)) for seed, index in ((300, 1750), (0, 2000), (200, 3000), (100, 2750))
    ]
    datasets_forget()
    killed = 0
    for memory_mib in range(56, 68, 2):
        sandbox = ScoringSandbox(workers=1, seconds_per_answer=30, memory_bytes=memory_mib * 2**20, **sandbox_args)
        try:
            scores = [sandbox.score(spec.dataset, spec.config, seed, e, [e["answer"], "1"]) for seed, e in entries]
            assert scores == [[1.0, 0.0]] * len(entries), memory_mib
            killed += sandbox.killed
        finally:
            sandbox.close()
    return killed


def test_a_worker_keeps_room_for_the_next_batch_whatever_its_datasets_hold():
    assert _score_count_primes_filling_a_worker() == 0  # none died taking a batch


def test_a_batch_a_worker_has_no_room_to_take_goes_to_a_fresh_one():
    # Keeping no room, a worker whose datasets fill its bound dies receiving the next batch.
    assert _score_count_primes_filling_a_worker(headroom=0) >= 1


def test_a_timeout_raises_with_the_scores_it_has(logic_changed):
    entry = build_entry(LOGIC, 5, 11)
    ds = dataset_for(LOGIC, 5)
    completions = ["<answer>P</answer>", "<answer>" + "¬" * 1000 + "P</answer>", "no tags"]
    with pytest.raises(ScoringTimeout) as raised:
        score_completions(LOGIC, 5, entry, completions)
    assert raised.value.code == "verification_timeout"
    assert raised.value.timed_out == [1]
    assert raised.value.scores == [ds.score_answer("P", entry), 0.0, 0.0]


def test_concurrent_callers_get_their_own_scores():
    entries = [build_entry(SPIRAL, 3, i) for i in range(12)]
    results: dict[int, list[float]] = {}

    def score(i: int) -> None:
        entry = entries[i]
        results[i] = score_completions(
            SPIRAL, 3, entry, [f"<answer>{entry['answer']}</answer>", "<answer>1 2</answer>"]
        )

    threads = [threading.Thread(target=score, args=(i,)) for i in range(len(entries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {i: [1.0, 0.0] for i in range(len(entries))}


def test_a_node_drops_an_external_group_whose_scoring_ran_out_of_time(logic_changed):
    _, tok = make_policy("a")
    entry = build_entry(LOGIC, 5, 11)
    group = Group(
        id="ext-slow",
        round=1,
        task=TaskRef("propositional_logic", 5, 11),
        question=entry["question"],
        answer=None,
        completions=["<answer>P</answer>", "<answer>" + "¬" * 1000 + "P</answer>"],
        rewards=[0.0, 0.0],
        node="peer",
    )
    catalogue = Catalogue("custom", (LOGIC,))
    train, stats = assemble(
        [],
        [group],
        n_local=0,
        n_external=1,
        rng=random.Random(0),
        catalogue=catalogue,
        tokenizer=tok,
        format_prompt=format_prompt,
        max_tokens=16,
    )
    assert train == [] and stats.external_invalid == 1 and stats.reasons == {"verification_timeout": 1}


def test_a_scorer_whose_caller_has_gone_ends_quietly():
    # A worker comes from the fork server and outlives the process it scores for: stopped while the
    # worker scores, that process has closed its end before the worker answers.
    from sapo_node.verifiers.sandbox import MAX_BATCH, MEMORY_BYTES, _serve, worker_context

    ctx = worker_context()
    conn, child = ctx.Pipe()
    args = (child, ctx.RawValue("i", 0), ctx.RawArray("d", MAX_BATCH), MEMORY_BYTES, MEMORY_BYTES // 4)
    process = ctx.Process(target=_serve, args=args, name="sapo-scorer")
    process.start()
    child.close()
    conn.send(("basic_arithmetic", {}, 0, {"question": "1 + 1 =", "answer": "2", "metadata": {}}, ["2"], 5.0))
    conn.close()
    process.join(120)
    assert process.exitcode == 0  # an exception escaping the worker prints its traceback and exits 1
