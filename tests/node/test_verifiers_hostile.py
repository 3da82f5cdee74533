"""Hostile completions against every dataset of both catalogues: no code runs, no credit, bounded time.

The payloads are the ones found against the pool by black-box attack (an eval that writes a file,
`9**9**9`, 8,000 `¬`), and their relatives: huge numbers, deep nesting, many atoms, NUL, lone
surrogates, thousands of unclosed answer tags. Each is scored through sapo_node.tasks (the path the
server and the nodes use), with eval, exec and compile replaced by functions that record the call.
"""

from __future__ import annotations

import builtins
import contextlib
import time

import pytest

from sapo_node.tasks import CATALOGUES, build_entry, dataset_for, extract_answer, score_completion, score_completions
from sapo_node.verifiers import logic
from sapo_node.verifiers.vetted import max_answer_chars

SPECS = [(catalogue.name, spec) for catalogue in CATALOGUES.values() for spec in catalogue.tasks]
# Per score, on a loaded 2-core machine; reasoning-gym took 0.26 s to 21 s on several of these.
SECONDS_PER_SCORE = 0.1


def payloads(marker) -> dict[str, str]:
    """name -> completion text."""
    touch = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    tagged = {
        "eval_touch": touch,
        "eval_touch_in_list": f"[[{touch}]]",
        "eval_lambda": f"(lambda: {touch})()",
        "power_tower": "9**9**9",
        "power_tower_in_matrix": "[[9**9**9]]",
        "negations_8000": "¬" * 8000 + "P",
        "negations_under_cap": "¬" * (max_answer_chars("propositional_logic") - 2) + "P",
        "parentheses_5000": "(" * 5000 + "P" + ")" * 5000,
        "parentheses_under_cap": "(" * 120 + "P" + ")" * 120,
        "brackets_5000": "[" * 5000 + "]" * 5000,
        "brackets_under_cap": "[" * 400 + "0" + "]" * 400,
        "conjunction_chain": " ∧ ".join(["P"] * 60),
        "many_atoms": " ∧ ".join(f"a{i}" for i in range(40)),
        "digits_8000": "9" * 8000,
        "digits_4000_fraction": "1" + "0" * 4000 + "/3",
        "latex_fraction_huge": "\\frac{" + "9" * 5000 + "}{7}",
        "exponent_huge": "1e999999999999999999",
        "hex_huge": "[[0x" + "f" * 900 + "]]",
        "nul": "\x00" * 64,
        "nul_inside": "P\x00Q",
        "lone_surrogate": "\ud800",
        "lone_surrogates_mixed": "1\udfff/\ud8002",
        "nan": "NaN",
        "snan": "sNaN",
    }
    texts = {name: f"<answer>{text}</answer>" for name, text in tagged.items()}
    texts["unclosed_tags"] = "<answer>" * 1000 + "x"  # quadratic for reasoning-gym's regular expression
    texts["unclosed_then_closed"] = "<answer>" * 1000 + "</answer>"
    texts["long_text"] = "x" * 8192
    return texts


# Payloads longer than every dataset's cap, or with no closed answer: exactly 0 everywhere.
ZERO_EVERYWHERE = {
    "negations_8000",
    "parentheses_5000",
    "brackets_5000",
    "digits_8000",
    "digits_4000_fraction",
    "latex_fraction_huge",
    "hex_huge",
    "unclosed_tags",
    "long_text",
}
# Code, for the dataset whose reasoning-gym scorer evaluated it; an unbounded truth table for logic.
ZERO_ON = {
    "binary_matrix": {"eval_touch", "eval_touch_in_list", "eval_lambda", "power_tower", "power_tower_in_matrix"},
    "propositional_logic": {"many_atoms"},
}
# Formulas, pathological only for reasoning-gym's parser: for propositional_logic they may be right
# (253 negations of P are a conclusion like any other), so their score is reasoning-gym's.
FORMULAS = {"negations_under_cap", "parentheses_under_cap", "conjunction_chain"}


@contextlib.contextmanager
def refusing_code():
    """eval, exec and compile record any call and raise, inside the block; yields the list of calls."""
    calls: list[str] = []
    saved = {name: getattr(builtins, name) for name in ("eval", "exec", "compile")}

    def refuse(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise RuntimeError(f"{name} called while scoring")

        return call

    try:
        for name in saved:
            setattr(builtins, name, refuse(name))
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(builtins, name, fn)


@pytest.mark.parametrize(("catalogue", "spec"), SPECS, ids=[f"{c}-{s.dataset}" for c, s in SPECS])
def test_hostile_completions_run_no_code_get_no_credit_and_return_fast(catalogue, spec, tmp_path):
    marker = tmp_path / "pwned"
    entries = [build_entry(spec, 31, i) for i in range(3)]
    results = []
    with refusing_code() as calls:
        for name, completion in payloads(marker).items():
            for entry in entries:
                start = time.perf_counter()
                score = score_completion(spec, 31, entry, completion)
                results.append((name, entry, score, time.perf_counter() - start))
    assert calls == []
    assert not marker.exists()
    for name, entry, score, elapsed in results:
        assert elapsed < SECONDS_PER_SCORE, (spec.dataset, name, elapsed)
        if name in ZERO_EVERYWHERE or name in ZERO_ON.get(spec.dataset, ()):
            assert score == 0.0, (spec.dataset, name, score)
        elif spec.dataset == "propositional_logic" and name in FORMULAS:
            answer = extract_answer(payloads(marker)[name])
            assert score == dataset_for(spec, 31).score_answer(answer, entry), (name, score)
        else:
            # Below the right answer's score: what reasoning-gym gives text that is not the answer
            # (0.05 for a formula that does not follow, 0.01 for a fraction that does not parse,
            # len(oracle)/len(text) for text that contains it), or 0.
            assert score < 0.25, (spec.dataset, name, score)


def test_a_whole_group_of_pathological_formulas_is_cheap():
    """32 completions at the length cap, the worst shapes for the parser: well under a second."""
    spec = CATALOGUES["sapo"].get("propositional_logic")
    entry = build_entry(spec, 5, 5)
    cap = max_answer_chars("propositional_logic")
    shapes = [
        "¬" * (cap - 1) + "P",
        "(" * (cap // 2 - 1) + "P" + ")" * (cap // 2 - 1),
        "P∧" * (cap // 2 - 1) + "P",
        "(P ∨ " * (cap // 5) + "Q" + ")" * (cap // 5),
        "P→¬" * (cap // 3),
    ]
    completions = [f"<answer>{shapes[i % len(shapes)][:cap]}</answer>" for i in range(32)]
    start = time.perf_counter()
    scores = score_completions(spec, 5, entry, completions)
    assert time.perf_counter() - start < 0.5
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_many_atoms_never_build_the_truth_table():
    """reasoning-gym builds a list of 2^atoms dicts (34 atoms: out of memory); ours stops at the bound."""
    spec = CATALOGUES["sapo"].get("propositional_logic")
    entry = build_entry(spec, 5, 5)
    answer = " ∨ ".join(f"x{i}" for i in range(100))
    start = time.perf_counter()
    assert logic.score(answer, entry) == 0.0
    assert time.perf_counter() - start < SECONDS_PER_SCORE
