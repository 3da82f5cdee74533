"""The JSON text bound into SQL: its length is what a stored group is charged (storage budgets)."""

from __future__ import annotations

import pytest

from common.compact_json import dumps, dumps_texts


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
