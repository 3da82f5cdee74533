"""sapo_node.proof: what the node and the server both derive from a challenge must not drift."""

from __future__ import annotations

import math

import pytest

from sapo_node import proof
from sapo_node.datasets import MAX_INDEX
from sapo_node.tasks import MAX_SEED


def test_bounds_are_the_task_range_and_the_auditable_models_the_ones_a_site_rebuilds():
    assert proof.SEED_BOUND == MAX_SEED + 1
    assert proof.INDEX_BOUND == MAX_INDEX
    from sapo_node.packaged import PACKAGED
    from sapo_node.tiny.variants import VARIANTS

    assert proof.AUDITABLE_MODELS == set(VARIANTS) | set(PACKAGED)


def test_a_challenge_names_fixed_questions_in_range_and_another_challenge_others():
    a, b = proof.task_indices("c-a"), proof.task_indices("c-b")
    assert a == proof.task_indices("c-a") and len(a) == proof.QUESTIONS_PER_CHALLENGE
    assert all(0 <= i < MAX_INDEX for i in a) and len(set(a)) == len(a)
    assert not set(a) & set(b)
    assert 0 <= proof.task_seed("c-a") <= MAX_SEED and proof.task_seed("c-a") != proof.task_seed("c-b")
    with pytest.raises(ValueError):
        proof.task_index("c-a", proof.QUESTIONS_PER_CHALLENGE)


def test_the_server_tells_which_question_an_index_is_and_refuses_every_other_index():
    for challenge in ("c-a", "c1.17.1764651600000.00ff00ff00ff00ff.0123456789abcdef0123456789abcdef"):
        indices = proof.task_indices(challenge)
        assert [proof.question_number(challenge, i) for i in indices] == list(range(len(indices)))
        named = set(indices)
        others = [i for i in range(0, MAX_INDEX, 997_331) if i not in named]
        assert others and all(proof.question_number(challenge, i) is None for i in others)
        assert proof.question_number(challenge, -1) is None and proof.question_number(challenge, MAX_INDEX) is None
        assert proof.question_number("c-b", indices[0]) != 0  # another challenge's question 0 is not this one's


def test_each_completion_has_its_own_stream_and_a_prefix_is_stable():
    keys = {proof.completion_key("c", "basic_arithmetic", 5, 7, k) for k in range(8)}
    assert len(keys) == 8
    key = proof.completion_key("c", "basic_arithmetic", 5, 7, 0)
    long = proof.uniforms(key, 1000)
    assert long[:10] == proof.uniforms(key, 10)
    assert all(0.0 <= u < 1.0 for u in long)
    assert abs(sum(long) / len(long) - 0.5) < 0.05
    # fixed values: a change to the derivation breaks every audit of groups already shared
    assert proof.uniforms(bytes(32), 2) == pytest.approx([0.9204642867540679, 0.2586866308245084], abs=0)


def test_ids_and_floats_round_trip_and_garbage_is_a_value_error():
    ids = [0, 1, 49151, 2**32 - 1]
    assert proof.decode_ids(proof.encode_ids(ids)) == ids
    lp = [-0.25, -3.5, -(2.0**-20), -math.inf]  # float32-exact values
    assert proof.decode_floats(proof.encode_floats(lp)) == lp
    for bad in ("not base64!", "AAA=", "AAAAAAA="):
        with pytest.raises(ValueError):
            proof.decode_ids(bad)


def test_the_weights_digest_ignores_order_and_sees_every_byte_name_and_shape():
    t = [("b", "float32", (2,), b"\0" * 8), ("a", "float32", (1, 2), b"\1" * 8)]
    base = proof.weights_digest(t)
    assert base == proof.weights_digest(list(reversed(t)))
    assert len(base) == proof.DIGEST_HEX_CHARS
    assert base != proof.weights_digest([t[0], ("a", "float32", (1, 2), b"\1" * 7 + b"\2")])
    assert base != proof.weights_digest([t[0], ("a", "float32", (2, 1), b"\1" * 8)])
    assert base != proof.weights_digest([t[0], ("c", "float32", (1, 2), b"\1" * 8)])
    assert base != proof.weights_digest([t[0], ("a", "bfloat16", (1, 2), b"\1" * 8)])
