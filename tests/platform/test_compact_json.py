"""The JSON text bound into SQL (its length is what a stored group is charged: storage budgets), and the
node socket's replies with members already in JSON."""

from __future__ import annotations

import json
import math
import random

import pytest

from common.compact_json import Raw, RawList, dumps, dumps_floats, dumps_object, dumps_texts


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
    cases += [
        [
            rng.choice([rng.random(), rng.uniform(-1e9, 1e9), math.ldexp(rng.random(), rng.randint(-1070, 1020))])
            for _ in range(rng.randint(1, 16))
        ]
        for _ in range(2000)
    ]
    cases += [[1.0, math.nan], [math.inf, 0.0], [-math.inf]]
    for values in cases:
        assert dumps_floats(values) == dumps(values)
        assert dumps_floats(tuple(values)) == dumps(values)


def _value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "text", "none", "bool"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-(2**40), 2**40)
    if kind == "float":
        return rng.uniform(-1e6, 1e6)
    if kind == "text":
        return "".join(
            rng.choice(["a", '"', "\\", "\n", "é", "数", "\U0001f600", "\ud800", " "]) for _ in range(rng.randint(0, 6))
        )
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def _already_json(value, rng: random.Random):
    """`value` given as JSON text: a Raw of its text, or, for a list, a RawList of its items' texts."""
    if isinstance(value, list) and rng.random() < 0.5:
        return RawList([json.dumps(item, ensure_ascii=False) for item in value])
    return Raw(json.dumps(value, ensure_ascii=False))


def test_an_object_with_members_already_in_json_is_the_object_json_would_write():
    """dumps_object: the same object, member order kept, whichever members come as Raw text or as a
    RawList of their items' texts (none, some in runs, all; lists empty, of one, of several), with keys
    and texts JSON must escape; without either, json's own text."""
    rng = random.Random(11)
    lists = 0
    for _ in range(3000):
        members = {
            rng.choice(["type", "ref", 'k"ey', "ключ", f"m{rng.randint(0, 99)}"]): _value(rng)
            for _ in range(rng.randint(0, 6))
        }
        if rng.random() < 0.3:  # a reply's list of groups: objects of their own, or nothing
            members[rng.choice(["rollouts", "m0"])] = [_value(rng) for _ in range(rng.randint(0, 4))]
        raw = {key for key in members if rng.random() < 0.4}
        given = {key: _already_json(value, rng) if key in raw else value for key, value in members.items()}
        lists += sum(type(value) is RawList for value in given.values())
        text = dumps_object(given)
        assert json.loads(text) == members
        assert list(json.loads(text)) == list(members)
        if not raw:
            assert text == json.dumps(members, separators=(",", ":")) and text.isascii()
    assert lists > 300  # the RawList members were many, of every length drawn


def test_a_raw_value_anywhere_but_a_member_is_refused_not_quoted():
    with pytest.raises(TypeError):
        dumps_object({"outer": {"inner": Raw("[1]")}})
    with pytest.raises(TypeError):
        dumps({"outer": Raw("[1]")})
    with pytest.raises(TypeError):
        dumps_object({"outer": [RawList(["1"])]})
    with pytest.raises(TypeError):
        dumps({"outer": RawList(["1"])})
