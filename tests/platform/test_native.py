"""The moderation rules' text work in C (native/, `sapo_native`) against its numpy twins in
moderation.filters and against the definitions: the same normalised bytes, simhashes and character
counts, bit for bit (fingerprints stored by one are compared with fingerprints made by the other when
a deployment gains or loses the extension)."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pytest
import sapo_native

from common import native as common_native
from moderation import filters, kernels
from moderation.rules import default_rule

#: Characters the texts are drawn from: letters of both cases, every ASCII whitespace str.split() knows,
#: NUL (the numpy twin's batch separator), controls, and non-ASCII ones (wide, zero-width, BOM,
#: astral, a full-width letter NFKC folds, a ligature).
ALPHABET = (
    list("abcxyzABCXYZ0189<>/.,")
    + [" ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\x00", "\x07", "\x7f"]
    + ["é", "数", "\u200b", "\ufeff", "\u202e", "\U0001f600", "Ａ", "ﬁ", "\x85", "\u2028"]
)
#: Lone surrogates: the frame parser refuses them, but the C functions take any str, and so must the twins.
SURROGATES = ["\ud800", "\udfff"]


def random_texts(rng: random.Random, n: int, *, ascii_only: bool) -> list[str]:
    alphabet = [c for c in ALPHABET if c.isascii()] if ascii_only else ALPHABET
    texts = []
    for _ in range(n):
        # lengths around the 4-byte gram, the 255-gram counting chunks and the 4000-character cut
        length = rng.choice([0, 1, 3, 4, 5, 254, 258, 259, 600, 3999, 4003, 4100])
        if rng.random() < 0.3:  # runs: repeated characters and long whitespace runs
            texts.append("".join(rng.choice(alphabet) * rng.randint(1, 40) for _ in range(length // 20 + 1)))
        else:
            texts.append("".join(rng.choices(alphabet, k=length)))
    return texts


def test_the_extension_is_built_and_used_by_default():
    # make venv, .ci/run and the Docker image build it; without it the site still runs (ops.W002 warns)
    assert kernels.native() is sapo_native


@pytest.mark.parametrize("ascii_only", [True, False], ids=["ascii", "mixed"])
def test_normalising_matches_the_definition_and_the_numpy_twin(ascii_only):
    rng = random.Random(11)
    for _ in range(20):
        texts = random_texts(rng, 40, ascii_only=ascii_only)
        native = sapo_native.normalise_ascii(texts)
        assert native == [filters.normalise(t).encode("ascii") if t.isascii() else None for t in texts]
        assert kernels.normalised_ascii_numpy(texts) == native  # a NUL (the twin's separator) included


@pytest.mark.parametrize("ascii_only", [True, False], ids=["ascii", "mixed"])
def test_simhashes_match_the_numpy_twin(ascii_only):
    rng = random.Random(12)
    for _ in range(20):
        datas = [t[: filters.SIMHASH_CHARS].encode("utf-8") for t in random_texts(rng, 40, ascii_only=ascii_only)]
        native = np.frombuffer(sapo_native.simhashes(datas), dtype="<i8")
        assert native.tolist() == kernels.simhashes_numpy(datas).tolist()


@pytest.mark.parametrize("ascii_only", [True, False], ids=["ascii", "mixed"])
def test_character_counts_match_the_definition_and_the_numpy_twin(ascii_only):
    rng = random.Random(13)
    nonprintable = {c for lo, hi in kernels.NONPRINTABLE for c in range(lo, hi + 1)}
    for _ in range(20):
        texts = random_texts(rng, 40, ascii_only=ascii_only)
        native = np.frombuffer(sapo_native.char_counts(texts), dtype="<i8").reshape(len(texts), 4)
        by_definition = [
            [
                len(t),
                sum(ord(c) in nonprintable for c in t),
                sum(ord(c) > 127 for c in t),
                sum(a == b for a, b in zip(t, t[1:], strict=False)),
            ]
            for t in texts
        ]
        assert native.tolist() == by_definition
        assert np.stack(kernels.char_counts_numpy(texts), axis=1).tolist() == by_definition


def test_a_share_fingerprints_and_character_findings_are_the_same_with_and_without_the_extension(settings):
    rng = random.Random(14)
    groups = [random_texts(rng, 8, ascii_only=g % 3 != 0) for g in range(12)]
    groups += [
        [f"Step {i}: {rng.randint(0, 99)} plus {i} is {i * 7}. Naïve café? <answer>{i}</answer>"] * 8 for i in range(6)
    ]
    rule = default_rule("characters")
    rule.params.update(max_non_ascii_share=0.3, max_repeat_share=0.4)
    results = []
    for on in (True, False):
        settings.SAPO_NATIVE = on
        assert (kernels.native() is not None) is on
        results.append((filters.fingerprints(groups), filters.character_findings(groups, rule)))
    assert results[0] == results[1]
    assert any(results[0][1]) and not all(results[0][1])  # some groups broke a limit, some did not


#: Pieces answers are built from: the tags, near misses of them, and whitespace str.strip() removes
#: (ASCII, NEL, no-break space, em space, ideographic space) or keeps (zero-width space).
ANSWER_PIECES = [
    "<answer>",
    "</answer>",
    "<answer",
    "answer>",
    "</answer",
    "<ANSWER>",
    "<",
    ">",
    "/",
    " ",
    "\n",
    "\t",
    "\x85",
    "\xa0",
    "\u2003",
    "\u3000",
    "\u200b",
    "42",
    "x",
    "é",
    "数",
    "\U0001f600",
    "a b",
]


def test_answers_match_the_node_clients_extract_answer():
    from sapo_node.verifiers.answers import extract_answer

    rng = random.Random(15)
    texts = [
        "",
        "<answer>",
        "</answer>",
        "<answer></answer>",
        "<answer>a <answer>b</answer>",
        "<answer>1</answer></answer>",
        "<answer> \u3000 </answer>",
        "no tags at all",
        "x" * 5000 + "<answer>7</answer>",
        "<answer>" * 1000,
    ]
    for _ in range(3000):  # of every str kind: Latin-1, BMP and astral pieces mixed in
        texts.append("".join(rng.choices(ANSWER_PIECES, k=rng.randint(0, 30))))
    assert sapo_native.answers(texts) == [extract_answer(t) for t in texts]
    assert sum(extract_answer(t) is not None for t in texts) > 400  # a good part of them hold a match


def test_a_group_is_verified_the_same_with_and_without_the_extension(settings):
    from pool.records import RolloutIn
    from pool.verification import verify_rollout
    from sapo_node.tasks import EASY_CATALOGUE, build_entry

    spec = EASY_CATALOGUE.get("basic_arithmetic")
    entry = build_entry(spec, 3, 5)
    answer = str(entry["answer"])
    completions = (
        f"so <answer> {answer} </answer>",
        f"<answer>{answer}</answer> and <answer>0</answer>",
        f"<answer>{answer}\u3000</answer>",
        "none",
        f"<answer>x<answer>{answer}</answer>",
    )
    results = []
    for on in (True, False):
        settings.SAPO_NATIVE = on
        rollout = RolloutIn(
            id=uuid.uuid4(),
            round=1,
            dataset="basic_arithmetic",
            seed=3,
            index=5,
            question=entry["question"],
            answer=answer,
            completions=completions,
            rewards=(1.0, 0.0, 1.0, 0.0, 0.1),
        )
        results.append(verify_rollout(rollout, EASY_CATALOGUE))
    assert results[0] == results[1]
    assert results[0].accepted and results[0].verified_rewards == (1.0, 0.0, 1.0, 0.0, 0.1)  # "x<answer>N": 0.1


@pytest.mark.parametrize(
    ("function", "element"),
    [("normalise_ascii", "text"), ("simhashes", b"bytes"), ("char_counts", "text"), ("answers", "text")],
)
def test_anything_but_a_list_of_the_right_type_is_a_type_error(function, element):
    call = getattr(sapo_native, function)
    wrong = b"bytes" if isinstance(element, str) else "text"
    for bad in ([element, wrong], [element, None], [element, 1], (element,), element):
        with pytest.raises(TypeError):
            call(bad)
    call([element])  # the right type passes


def test_a_site_without_the_extension_says_so_at_start_up(monkeypatch, settings):
    from ops.checks import native_extension

    assert native_extension(None) == []
    monkeypatch.setattr(common_native, "sapo_native", None)  # as on a machine where native/ was not built
    assert kernels.native() is None
    (warning,) = native_extension(None)
    assert warning.id == "ops.W002" and "pip install ./native" in warning.hint
    settings.SAPO_NATIVE = False  # off on purpose: nothing to say
    assert native_extension(None) == []


# --- the statements' arrays (common.db.binary_array) -----------------------------------------------

ARRAYS = {
    "text": ["plain", "", None, "é数\U0001f600", "x" * 70_000, "quote ' and \\\\ backslash, {braces}"],
    "bytea": [b"", b"\x00\xff" * 9, None, bytes(range(256))],
    "int4": [0, -1, 2**31 - 1, -(2**31), None],
    "int8": [0, -1, 2**63 - 1, -(2**63), None, 10**12],
    "bool": [True, False, None],
    "uuid": [uuid.uuid4(), None, uuid.UUID(int=0), uuid.UUID(int=2**128 - 1)],
}


@pytest.mark.django_db
@pytest.mark.parametrize("kind", list(ARRAYS))
def test_arrays_encoded_in_c_reach_postgresql_as_psycopg_sends_them(kind, settings):
    """What PostgreSQL reads from the C encoding (and returns) is what it reads from psycopg's own
    element-by-element dumping of the same list, NULLs, empty arrays and every value's extremes included."""
    from common.db import BinaryArray, binary_array, server_binding_cursor

    values = ARRAYS[kind]
    sql = f"SELECT %(a)b::{kind}[], %(b)b::{kind}[], %(a)b::{kind}[] IS NOT DISTINCT FROM %(b)b::{kind}[]"
    for chosen in (values, values[:1], [None], []):
        settings.SAPO_NATIVE = True
        packed = binary_array(kind, list(chosen))
        assert isinstance(packed, BinaryArray)
        settings.SAPO_NATIVE = False
        plain = binary_array(kind, list(chosen))
        assert plain == list(chosen)  # the twin: psycopg dumps the list itself
        with server_binding_cursor() as cursor:
            if not chosen:  # psycopg cannot type an empty list in binary: compare with an empty literal
                cursor.execute(f"SELECT %(a)b::{kind}[], %(a)b::{kind}[] = '{{}}'::{kind}[]", {"a": packed})
                assert cursor.fetchone() == ([], True)
                continue
            cursor.execute(sql, {"a": packed, "b": plain})
            mine, theirs, same = cursor.fetchone()
        assert same and mine == theirs == list(chosen)


@pytest.mark.parametrize(
    ("kind", "bad", "error"),
    [
        ("text", ["ok", b"bytes"], TypeError),
        ("text", ["\ud800"], UnicodeEncodeError),  # a lone surrogate (the frame parser refuses them first)
        ("bytea", [b"ok", "str"], TypeError),
        ("int4", [1, 2**31], OverflowError),
        ("int4", [1, True], TypeError),
        ("int4", [1.5], TypeError),
        ("int8", [2**63], OverflowError),
        ("bool", [1], TypeError),
        ("uuid", ["8f4e6b3e-3f0c-4a49-9d3c-0d5f3e7a1b2c"], TypeError),
    ],
)
def test_an_element_of_the_wrong_type_is_an_error_not_a_guess(kind, bad, error):
    from common.db import binary_array

    with pytest.raises(error):
        binary_array(kind, bad)


def test_the_copy_lookups_refuse_buffers_of_the_wrong_shape():
    """exact_first and near_first read the screening query's bytes: a size that is not a whole number of
    digests or hashes, or probes that are not a list of 64-bit integers, is an error, never a guess."""
    with pytest.raises(ValueError):
        sapo_native.exact_first(bytes(15), bytes(16))
    with pytest.raises(ValueError):
        sapo_native.exact_first(bytes(16), bytes(17))
    with pytest.raises(ValueError):
        sapo_native.near_first(bytes(7), [1], 3, 64)
    with pytest.raises(TypeError):
        sapo_native.near_first(bytes(8), (1,), 3, 64)
    with pytest.raises(TypeError):
        sapo_native.near_first(bytes(8), ["1"], 3, 64)
    with pytest.raises(OverflowError):
        sapo_native.near_first(bytes(8), [1 << 64], 3, 64)
    assert sapo_native.exact_first(b"", bytes(32)) == [-1, -1]
    assert sapo_native.near_first(bytes(8), [0, 1, -1], 0, 64) == [0, -1, -1]
    assert sapo_native.near_first(bytes(8), [0], 0, 0) == [-1]  # an empty bucket holds nothing


def test_the_character_counts_twin_takes_lone_surrogates_as_c_does():
    rng = random.Random(15)
    for _ in range(20):
        texts = ["".join(rng.choices(ALPHABET + SURROGATES, k=rng.choice([1, 5, 300]))) for _ in range(20)]
        native = np.frombuffer(sapo_native.char_counts(texts), dtype="<i8").reshape(len(texts), 4)
        assert np.stack(kernels.char_counts_numpy(texts), axis=1).tolist() == native.tolist()


#: Run in a child process (a crash there is a failed test, not a lost run): a list that Python code
#: empties or shrinks while the call reads it. The garbage collector is made to run at the call's
#: first allocation, and its finalizer empties the list; a uuid's `int` empties the list pg_array reads.
CHANGED_UNDER_THE_CALL = """
import gc, sys, uuid
import sapo_native
which = sys.argv[1]
if which == "pg_array":
    values = []
    class Shrinking:
        @property
        def int(self):
            values.clear()
            return 5
    values.extend([Shrinking()] + [uuid.uuid4() for _ in range(1000)])
    print(len(sapo_native.pg_array(5, 2950, values)))
else:
    target = [b"hello" if which == "simhashes" else "hello <answer> 1 </answer>"] * 1000
    class Clearer:
        def __del__(self):
            target.clear()
    def garbage():
        loop = Clearer()
        loop.self = loop
    call = getattr(sapo_native, which)
    gc.collect()
    gc.disable()
    garbage()
    gc.set_threshold(1)
    gc.enable()
    out = call(target)
    print(len(out), out[0] if isinstance(out, list) else "")
"""


@pytest.mark.parametrize(
    ("function", "answer"),
    [
        ("normalise_ascii", "1000 b'hello <answer> 1 </answer>'"),
        ("answers", "1000 1"),
        ("char_counts", str(32 * 1000) + " "),
        ("simhashes", str(8 * 1000) + " "),
        ("pg_array", str(20 + 20 * 1001)),
    ],
)
def test_a_list_changed_by_python_code_during_the_call_is_read_as_it_was_called(function, answer):
    """Each call holds its own references to the list's items (the old code read the list's borrowed
    items after an allocation, or after a uuid's `int`: a segmentation fault, or under UBSan a load of
    a null pointer)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.run(
        [sys.executable, "-c", CHANGED_UNDER_THE_CALL, function], env=env, capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == answer.strip()


def test_exact_first_stays_linear_when_digests_share_their_first_8_bytes():
    """16,000 probes and 16,000 candidates whose digests all share their first 8 bytes cost what random
    ones do (keyed by the first 8 bytes, every lookup walked a chain of 16,000: 0.95 s)."""
    import os
    import time

    n = 16_000
    shared = b"\x00" * 8
    probes = b"".join(shared + i.to_bytes(8, "little") for i in range(n))
    candidates = b"".join(shared + (i + n // 2).to_bytes(8, "little") for i in range(n))

    def timed(exact: bytes, probe: bytes) -> tuple[float, list[int]]:
        started = time.perf_counter()
        found = sapo_native.exact_first(exact, probe)
        return time.perf_counter() - started, found

    chained, found = timed(candidates, probes)
    assert found == [-1] * (n // 2) + list(range(n // 2))  # still exact: each probe's first equal candidate
    random_cost = min(timed(os.urandom(16 * n), os.urandom(16 * n))[0] for _ in range(3))
    assert chained < 10 * random_cost + 0.05, (chained, random_cost)
