"""Our scoring gives reasoning-gym's score on honest answers (and on wrong ones), dataset by dataset.

For every dataset of both catalogues, thousands of entries: the entry's own answer, that answer in a
sentence, perturbed, another entry's answer, and dataset-specific forms (Python lists for
binary_matrix, random formulas and mutations of them for propositional_logic, numbers written
differently for the arithmetic ones). Our score (sapo_node.tasks.score_completion, through the length
caps and our own parsers) must equal reasoning-gym's (its `extract_answer` and `score_answer`, as the
pool scored before) on every one. Inputs are generated here, so handing them to reasoning-gym's
`eval` is safe; every one is within its dataset's length cap and atom bound.
"""

from __future__ import annotations

import random
import re
import string

import pytest
from reasoning_gym.utils import extract_answer as rg_extract_answer

from sapo_node.tasks import CATALOGUES, TaskError, build_entry, dataset_for, extract_answer, score_completion
from sapo_node.verifiers import logic
from sapo_node.verifiers.vetted import max_answer_chars

# reasoning-gym's eval warns about the generated near-literals ("[1 (2)]"): expected, not news.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

ENTRIES = 1500  # per dataset and catalogue
SPECS = [(catalogue.name, spec) for catalogue in CATALOGUES.values() for spec in catalogue.tasks]


def rg_score(ds, entry, completion: str) -> float:
    """How the pool scored before: reasoning-gym's extraction and scorer, errors as 0."""
    answer = rg_extract_answer(completion, tag_name="answer", strip=True)
    if answer is None:
        return 0.0
    try:
        return float(min(1.0, max(0.0, float(ds.score_answer(answer, entry)))))
    except Exception:
        return 0.0


def mutate(rng: random.Random, text: str, alphabet: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(3)
        k = rng.randrange(len(chars) + 1)
        if op == 0 or not chars:
            chars.insert(k, rng.choice(alphabet))
        elif op == 1:
            del chars[min(k, len(chars) - 1)]
        else:
            chars[min(k, len(chars) - 1)] = rng.choice(alphabet)
    return "".join(chars)


def matrix_forms(rng: random.Random, text: str) -> list[str]:
    """The matrix text as a Python literal, in the ways a model (or a fuzzer) might write it."""
    rows = [row.split(" ") for row in text.split("\n")]

    def item(x: str) -> str:
        return rng.choice(
            [
                x,
                x,
                x,
                f"+{x}",
                f"-{x}" if x == "0" else x,
                f"({x})",
                f"'{x}'",
                f"0x{int(x):x}",
                f"0{x}" if x == "0" else x,
                f"- -{x}",
                f'"{x}"',
                f"{x}_0"[: len(x)],
                f"0b{int(x):b}",
            ]
        )

    def seq(items: list[str], outer: bool) -> str:
        sep = rng.choice([", ", ",", " , ", ",\n ", ",\t"])
        body = sep.join(items) + rng.choice(["", "", ","])
        if rng.random() < 0.25 and not (len(items) == 1 and not body.endswith(",")):
            return f"({body})"
        return f"[{body}]"

    forms = [
        str([[int(x) for x in row] for row in rows]),
        seq([seq([item(x) for x in row], False) for row in rows], True),
        seq([seq([item(x) for x in row], False) for row in rows], True),
        seq(["'" + " ".join(row) + "'" for row in rows], True),  # rows as strings of the row's text
        seq(["'" + "".join(row) + "'" for row in rows], True),  # rows as strings of digits
        str([[int(x) for x in row] for row in rows[:-1]]),  # a row short
        str([[int(x) + (1 if i == 0 else 0) for i, x in enumerate(row)] for row in rows]),  # one item off
    ]
    # No + or - in mutations: "0-0" is arithmetic, which eval computes and our parser does not (documented).
    forms += [mutate(rng, forms[rng.randrange(len(forms))], "[](),0123456789 'x_\n") for _ in range(4)]
    return forms


def within_atom_bound(text: str, entry) -> bool:
    """Whether reasoning-gym's truth table for `text` stays within our bound (the documented difference
    above it is tested on its own)."""
    atoms, _ = logic._premises(tuple(entry["metadata"]["premises"]))
    try:
        logic._compile(text, dict(atoms))
    except logic.TooManyAtoms:
        return False
    except ValueError:
        pass
    return True


def formula_forms(rng: random.Random, ds, entry) -> list[str]:
    meta = entry["metadata"]
    variables = list(meta["variables"])
    atoms = variables + ["a", "b", "T", "p q", "1"]
    forms = [meta["example_answer"], *meta["premises"], " ∧ ".join(meta["premises"])]
    for _ in range(4):
        depth = rng.randint(1, 4)
        expr = ds._generate_expression(rng, rng.sample(atoms, k=min(len(atoms), rng.randint(1, 6))), depth)
        forms.append(str(expr))
    forms += [mutate(rng, rng.choice(forms), "PQRS()¬∧∨→↔ ab") for _ in range(4)]
    forms.append("".join(rng.choice("PQR()¬∧∨→↔ ") for _ in range(rng.randint(1, 24))))
    forms.append("P ∨ ¬P")
    forms.append("(" * rng.randint(0, 3) + rng.choice(variables) + ")" * rng.randint(0, 3))
    return [f for f in forms if len(f) <= max_answer_chars("propositional_logic") and within_atom_bound(f, entry)]


def number_forms(rng: random.Random, answer: str) -> list[str]:
    forms = [
        f"+{answer}",
        f"0{answer}",
        f"{answer}.0",
        f"{answer},",
        f" {answer} ",
        answer.upper(),
        answer.lower(),
        answer.title(),
        f"{answer}/1",
        f"\\frac{{{answer}}}{{2}}",
        f"${answer}$",
        f"{answer}e0",
        "NaN",
        "-0",
        "1,000",
        "1_000",
        "١٢",
    ]
    try:
        value = int(answer)
        forms += [str(value + 1), str(value - 1), str(-value), f"{value:,}", str(value * 10**30)]
    except ValueError:
        pass
    numbers = [int(x) for x in re.findall(r"\d+", answer)]
    if len(numbers) == 2:
        n, d = numbers
        forms += [f"\\frac{{{n}}}{{{d}}}", f"\\dfrac {{ {n} }} {{ {d} }}", f"{d}/{n}", f"{n} / {d}", f"{n}/{d + 1}"]
    return forms


def answers_for(rng: random.Random, spec, ds, entry, other) -> list[str]:
    """Honest, perturbed and wrong answers for one entry."""
    if spec.dataset == "propositional_logic":
        return formula_forms(rng, ds, entry)
    answer = str(entry["answer"])
    forms = [
        answer,
        f"The answer is {answer}.",
        str(other["answer"]),
        "",
        " ",
        answer + answer,
        mutate(rng, answer, string.digits + string.ascii_letters + " -./\n"),
    ]
    if spec.dataset == "binary_matrix":
        forms += matrix_forms(rng, answer)
    else:
        forms += number_forms(rng, answer)
    return [f for f in forms if len(f.strip()) <= max_answer_chars(spec.dataset)]


@pytest.mark.parametrize(("catalogue", "spec"), SPECS, ids=[f"{c}-{s.dataset}" for c, s in SPECS])
def test_our_score_is_reasoning_gyms_on_thousands_of_answers(catalogue, spec):
    rng = random.Random(f"{catalogue}:{spec.dataset}")
    seed = 4242
    ds = dataset_for(spec, seed)
    compared, scores = 0, set()
    previous = build_entry(spec, seed, 0)
    for _ in range(ENTRIES):
        try:
            entry = build_entry(spec, seed, rng.randrange(10**9))
        except TaskError:  # the rare index reasoning-gym cannot generate
            continue
        for answer in answers_for(rng, spec, ds, entry, previous):
            completion = rng.choice(
                [
                    "{}",
                    "I think so. <answer>{}</answer>",
                    "<answer>x</answer> <answer>{}</answer>",
                    "<answer>\n{} </answer>\n",
                ]
            ).format(answer)
            ours, theirs = score_completion(spec, seed, entry, completion), rg_score(ds, entry, completion)
            assert ours == theirs, (spec.dataset, entry["question"][-200:], completion)
            compared += 1
            scores.add(ours)
        previous = entry
    # The answers exercised more than one outcome: full, partial or none (not a vacuous comparison).
    assert compared >= 8 * ENTRIES and len(scores) >= 2, (compared, scores)


def test_binary_matrix_literal_forms_get_the_literal_credit():
    spec = CATALOGUES["sapo"].get("binary_matrix")
    entry = build_entry(spec, 1, 3)
    rows = [[int(x) for x in row.split()] for row in entry["answer"].split("\n")]
    for form in (str(rows), str(tuple(tuple(r) for r in rows)), str(["".join(map(str, r)) for r in rows])):
        assert score_completion(spec, 1, entry, f"<answer>{form}</answer>") == 0.1
    assert score_completion(spec, 1, entry, f"<answer>{entry['answer']}</answer>") == 1.0


def test_propositional_logic_parity_on_random_strings():
    """Random strings over the formulas' alphabet, parsed both ways: the parse tree (hence the score)
    is reasoning-gym's, including its quirks (unbalanced parentheses, atoms with spaces)."""
    spec = CATALOGUES["sapo"].get("propositional_logic")
    ds = dataset_for(spec, 7)
    rng = random.Random(7)
    outcomes = set()
    for i in range(4000):
        entry = build_entry(spec, 7, i % 50)
        text = "".join(rng.choice("PQRS()¬∧∨→↔ ab") for _ in range(rng.randint(1, 30)))
        if not within_atom_bound(text, entry):
            continue
        try:
            theirs = ds.score_answer(text, entry)
        except RecursionError:  # not reached at this length; reasoning-gym's scorer lets it escape
            theirs = 0.0
        assert logic.score(text, entry) == theirs, text
        outcomes.add(theirs)
    assert outcomes == {0.0, 0.05, 0.25, 1.0}


def test_extract_answer_is_reasoning_gyms():
    rng = random.Random(3)
    pieces = ["<answer>", "</answer>", "<answer", "answer>", "</", " ", "\n", "\u00a0", "\u2003", "x", "42", "<", ">"]
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert extract_answer(text) == rg_extract_answer(text, tag_name="answer", strip=True), repr(text)


def test_an_answer_over_its_cap_scores_zero_where_reasoning_gym_gives_a_sliver():
    """The documented difference: reasoning-gym credits len(oracle)/len(answer) to any text containing
    the answer; above the cap (several times any honest answer) ours gives 0 without reading it."""
    spec = CATALOGUES["sapo"].get("basic_arithmetic")
    entry = build_entry(spec, 1, 1)
    ds = dataset_for(spec, 1)
    cap = max_answer_chars("basic_arithmetic")
    long = "x" * cap + str(entry["answer"])
    assert rg_score(ds, entry, f"<answer>{long}</answer>") > 0
    assert score_completion(spec, 1, entry, f"<answer>{long}</answer>") == 0.0
    at_cap = "x" * (cap - len(str(entry["answer"]))) + str(entry["answer"])
    assert (
        score_completion(spec, 1, entry, f"<answer>{at_cap}</answer>")
        == rg_score(ds, entry, f"<answer>{at_cap}</answer>")
        > 0
    )


def test_more_atoms_than_the_bound_score_zero():
    spec = CATALOGUES["sapo"].get("propositional_logic")
    entry = build_entry(spec, 1, 1)
    atoms = [f"a{i}" for i in range(logic.MAX_ATOMS + 1)]
    assert logic.score(" ∨ ".join(atoms), entry) == 0.0
    assert logic.score(" ∨ ".join(atoms[:4]), entry) in (0.05, 1.0, 0.25)
