"""The datasets whose scoring was read line by line, how long their answers may be, and who scores them.

Every dataset of both catalogues (SAPO and easy) is here. For each, the source of reasoning-gym
0.1.25's `score_answer` and of everything it calls was read:

| dataset | reasoning-gym's scorer | cost in the answer's length | here |
|---|---|---|---|
| arc_1d, basic_arithmetic, base_conversion, bf | `ProceduralDataset.score_answer`: `==`, then `oracle in answer` | linear (C string search, the oracle is short) | delegated |
| calendar_arithmetic | `strip`, `title`, `lower`, `int()`, one division, `math.exp` | linear (`int()` refuses more than 4,300 digits; an overflowing division raises and scores 0) | delegated |
| decimal_arithmetic | `Decimal(answer)` and one subtraction in a 28-digit context | linear (libmpdec; huge exponents cost nothing: measured) | delegated |
| fraction_simplification | `strip`, one anchored regular expression without nested repeats, `split`, `int()` | linear | delegated |
| binary_matrix | `eval(answer)` | code execution; `9**9**9` never returns | own parser (matrix.py) |
| propositional_logic | a recursive parser rescanning the text at every level, then a truth table as a list of dicts over every distinct atom | quadratic in length, exponential in atoms | own parser (logic.py) |

A delegated scorer runs in the calling process only while its source is the one reviewed: each
method it runs is named with the SHA-256 of its source below, and `delegate_in_process` checks them
against the installed reasoning-gym (once per dataset class). If a new reasoning-gym changes one, the
dataset is scored in the sandbox (sandbox.py) until someone reads the new code and updates the hash;
tests/node/test_verifiers_safety.py fails meanwhile, and scans the called code for eval, exec and
compile. A dataset not listed here (another catalogue, sent by a server this node does not know) is
always scored in the sandbox.

`max_answer_chars` bounds the answer (the text inside the tags, stripped); longer answers score 0
without being looked at. Each is several times the longest answer of 300 entries of the catalogue's
configuration (longest seen: arc_1d 59 characters, binary_matrix 199, or about 350 written as a Python
list of lists, basic_arithmetic 15, fraction_simplification 17, the others 10 or less), so an honest
answer, even one with a few words around it, is never cut. Where reasoning-gym gives partial credit
to a long answer containing the right one (len(oracle) / len(answer)), that credit is below 0.12 at
the cap, and it is 0 above.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sapo_node.verifiers import logic, matrix

#: Answers of a dataset not listed below (scored in the sandbox) are cut at this length.
DEFAULT_MAX_ANSWER_CHARS = 2048


@dataclass(frozen=True)
class Verifier:
    max_answer_chars: int
    #: Our own scorer, (answer, entry) -> score; None: reasoning-gym's, reviewed.
    own: Callable[[str, dict[str, Any]], float] | None = None
    #: For a delegated scorer: each method of the dataset's class that scoring runs, with the first 16
    #: hexadecimal digits of the SHA-256 of its source as reviewed.
    reviewed: dict[str, str] = field(default_factory=dict)


_BASE = {"score_answer": "d4c377f0ac8e002f"}  # reasoning_gym.dataset.ProceduralDataset.score_answer

VERIFIERS: dict[str, Verifier] = {
    "arc_1d": Verifier(512, reviewed=_BASE),
    "basic_arithmetic": Verifier(128, reviewed=_BASE),
    "base_conversion": Verifier(128, reviewed=_BASE),
    "bf": Verifier(256, reviewed=_BASE),
    "calendar_arithmetic": Verifier(128, reviewed={"score_answer": "f201391da152c94f"}),
    "decimal_arithmetic": Verifier(128, reviewed={"score_answer": "ae3b745c4d0dbb08"}),
    "fraction_simplification": Verifier(
        128, reviewed={"score_answer": "aa013e4952b0d79b", "_extract_fraction": "408d646f3d2a81a1"}
    ),
    "binary_matrix": Verifier(1024, own=matrix.score),
    "propositional_logic": Verifier(256, own=logic.score),
}


def max_answer_chars(dataset: str) -> int:
    verifier = VERIFIERS.get(dataset)
    return verifier.max_answer_chars if verifier else DEFAULT_MAX_ANSWER_CHARS


def source_digest(function: Any) -> str | None:
    """The first 16 hexadecimal digits of the SHA-256 of a function's source; None without source."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


# (dataset, dataset class) -> whether its delegated scorer is the reviewed code. Filled once per pair;
# a plain dict is enough across threads (two threads computing the same answer both store it).
_reviewed_classes: dict[tuple[str, type], bool] = {}


def delegate_in_process(dataset: str, instance: Any) -> bool:
    """Whether reasoning-gym's scorer for `dataset` may run in this process: the dataset is listed
    with a delegated scorer and every method scoring runs has the reviewed source."""
    key = (dataset, type(instance))
    known = _reviewed_classes.get(key)
    if known is None:
        verifier = VERIFIERS.get(dataset)
        known = bool(
            verifier is not None
            and verifier.own is None
            and verifier.reviewed
            and all(
                source_digest(getattr(type(instance), name, None)) == digest
                for name, digest in verifier.reviewed.items()
            )
        )
        _reviewed_classes[key] = known
    return known
