"""The JSON text bound into SQL: its length is what a stored group is charged (storage budgets)."""

from __future__ import annotations

import math
import random

import pytest

from common.compact_json import dumps, dumps_floats, dumps_texts


@pytest.mark.parametrize(
    "texts",
    [
        [],
        [""],
        ["plain words <answer>4</answer>", "x"],
        ['a "quote"', "back\\slash"],
        ["line\nbreak", "tab\tand\rreturn", "nul\x00", "unit\x1fseparator", "del\x7f is not escaped"],
        ["é", "数学", "\u2028", "emoji \U0001f600"],
        ["mixed", "plain", 'then "quoted"'],
    ],
)
def test_texts_are_written_as_the_encoder_writes_them(texts):
    assert dumps_texts(texts) == dumps(texts)
    assert dumps_texts(tuple(texts)) == dumps(texts)


def test_floats_are_written_as_the_encoder_writes_them():
    rng = random.Random(5)
    cases = [[], [0.0], [-0.0, 1.0, 0.5], [1e-7, 1e16, 1e22, -2.5e-300, 5e-324, 1.7976931348623157e308], [1, 0.5]]
    cases += [[rng.choice([rng.random(), rng.uniform(-1e9, 1e9), math.ldexp(rng.random(), rng.randint(-1070, 1020))])
               for _ in range(rng.randint(1, 16))] for _ in range(2000)]  # fmt: skip
    cases += [[1.0, math.nan], [math.inf, 0.0], [-math.inf]]
    for values in cases:
        assert dumps_floats(values) == dumps(values)
        assert dumps_floats(tuple(values)) == dumps(values)
