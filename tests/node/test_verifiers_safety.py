"""No scorer we run in process evaluates node text, and the reviewed reasoning-gym code is still the code
installed: these fail if a future reasoning-gym adds eval, exec or compile to a scorer we delegate to.

Two independent checks over every dataset of both catalogues:
- a source scan: from the dataset class's `score_answer`, every reasoning-gym function it can call
  (methods through `self`, module functions by name), transitively, read as source: none names eval,
  exec, compile or another code-running helper, and each is one of the reviewed methods (vetted.py),
  whose source hash must match;
- a run: thousands of answers, hostile and honest, scored with builtins eval, exec and compile
  replaced by functions that record the call and raise.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import textwrap

import pytest

from sapo_node.tasks import CATALOGUES, build_entry, dataset_for, score_completions
from sapo_node.verifiers import vetted

SPECS = {spec.dataset: spec for catalogue in CATALOGUES.values() for spec in catalogue.tasks}
CODE_RUNNERS = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "literal_eval",
    "sympify",
    "parse_expr",
    "import_module",
    "run_path",
    "run_module",
    "system",
    "popen",
    "Popen",
    "loads",
}
# Classes the delegated scorers only read as data (enum members), never call into.
DATA_CLASSES = {"Weekday", "CalendarTask"}


def reachable(cls: type, name: str) -> tuple[dict[str, object], set[str]]:
    """Reasoning-gym functions reachable from `cls.name` (qualified name -> function), and every name
    called or referenced along the way."""
    seen: dict[str, object] = {}
    names: set[str] = set()
    todo = [getattr(cls, name)]
    while todo:
        fn = todo.pop()
        key = f"{fn.__module__}.{fn.__qualname__}"
        if key in seen:
            continue
        seen[key] = fn
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        module_globals = fn.__globals__
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
                target = module_globals.get(node.id)
            elif isinstance(node, ast.Attribute):
                if not (isinstance(node.value, ast.Name) and node.value.id == "re"):  # re.compile is no code
                    names.add(node.attr)
                target = None
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    target = getattr(cls, node.attr, None)
            else:
                continue
            if inspect.isclass(target) and (target.__module__ or "").startswith("reasoning_gym"):
                assert target.__name__ in DATA_CLASSES, f"{key} uses reasoning-gym class {target.__name__}: review it"
            elif inspect.isfunction(target) and target.__module__.startswith("reasoning_gym"):
                todo.append(target)
    return seen, names


DELEGATED = sorted(name for name, v in vetted.VERIFIERS.items() if v.own is None)


def test_every_catalogue_dataset_has_a_reviewed_verifier():
    assert set(SPECS) <= set(vetted.VERIFIERS)
    assert {name for name, v in vetted.VERIFIERS.items() if v.own is not None} == {
        "binary_matrix",
        "propositional_logic",
    }


@pytest.mark.parametrize("dataset", DELEGATED)
def test_delegated_scorers_reach_only_reviewed_code_without_eval(dataset):
    spec = SPECS[dataset]
    cls = type(dataset_for(spec, 1))
    functions, names = reachable(cls, "score_answer")
    assert not names & CODE_RUNNERS, f"{dataset}'s scorer reaches {sorted(names & CODE_RUNNERS)}"
    reviewed = vetted.VERIFIERS[dataset].reviewed
    reviewed_functions = {name: getattr(cls, name) for name in reviewed}
    assert set(functions.values()) == set(reviewed_functions.values()), (
        f"{dataset}: reachable {sorted(functions)} differs from the reviewed {sorted(reviewed)}"
    )
    for name, digest in reviewed.items():
        assert vetted.source_digest(reviewed_functions[name]) == digest, (
            f"{dataset}: {name} changed since it was reviewed; read the new code, then update its hash in vetted.py"
        )
    assert vetted.delegate_in_process(dataset, dataset_for(spec, 1))


def test_the_scan_finds_eval_where_there_is_one():
    """The scan itself works: binary_matrix's reasoning-gym scorer (not run here) is caught."""
    cls = type(dataset_for(SPECS["binary_matrix"], 1))
    _, names = reachable(cls, "score_answer")
    assert "eval" in names


def test_a_changed_scorer_is_not_run_in_process(monkeypatch):
    spec = SPECS["decimal_arithmetic"]
    changed = vetted.Verifier(128, reviewed={"score_answer": "0" * 16})
    monkeypatch.setitem(vetted.VERIFIERS, "decimal_arithmetic", changed)
    monkeypatch.setattr(vetted, "_reviewed_classes", {})
    assert not vetted.delegate_in_process("decimal_arithmetic", dataset_for(spec, 1))


HOSTILE = [
    "__import__('os').system('true')",
    "[[__import__('os').getpid()]]",
    "9**9**9",
    "(lambda: 1)()",
    "[[0, 1], [1, 0]]",
    "exec('1')",
    "compile('1', 'x', 'eval')",
    "P ∧ ¬Q",
    "\\frac{1}{2}",
    "Monday",
    "1/2",
    "0.5",
]


@pytest.mark.parametrize("dataset", sorted(SPECS))
def test_no_scorer_calls_eval_exec_or_compile(dataset, monkeypatch):
    calls: list[str] = []

    def refuse(name):
        def call(*args, **kwargs):
            calls.append(name)
            raise RuntimeError(f"{name} called while scoring")

        return call

    spec = SPECS[dataset]
    entries = [build_entry(spec, 99, i) for i in range(150)]
    completions_per_entry = []
    for entry in entries:
        honest = entry["answer"] if entry["answer"] is not None else entry["metadata"]["example_answer"]
        completions_per_entry.append([f"<answer>{a}</answer>" for a in [honest, *HOSTILE]])
    for name in ("eval", "exec", "compile"):
        monkeypatch.setattr(builtins, name, refuse(name))
    scores = [score_completions(spec, 99, e, c) for e, c in zip(entries, completions_per_entry, strict=True)]
    monkeypatch.undo()
    assert calls == []
    assert sum(s[0] for s in scores) > 0.5 * len(entries)  # the honest answers still score
