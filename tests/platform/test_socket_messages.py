"""Frame validation (pure): every refusal has its protocol code."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest
from support.pool import make_group

from pool.limits import Limits
from pool.records import Report
from sockets import messages
from sockets.messages import MAX_INT_DIGITS, MAX_NESTING, Hello, ProtocolError, Sample, Share, leading_ref, parse_frame

# Last, not first: bench/pool.py would otherwise shadow the platform's pool package for every process
# the run starts afterwards (a multiprocessing child unpickling pool.build_worker imports by this path).
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import fuzz  # noqa: E402

LIMITS = Limits(
    max_frame_bytes=20_000,
    max_groups_per_message=3,
    max_completions_per_group=4,
    max_chars_per_completion=500,
    max_sample_n=8,
    max_used_per_report=5,
)


def parse(obj) -> object:
    return parse_frame(obj if isinstance(obj, str) else json.dumps(obj), LIMITS)


def share(**changes):
    group = make_group(right=1, wrong=1)
    group.update(changes)
    return {"type": "share", "v": 1, "rollouts": [group]}


def test_valid_frames_parse():
    assert isinstance(parse({"type": "hello", "v": 1, "client": "x", "ref": "r1"}), Hello)
    message = parse(share())
    assert isinstance(message, Share) and len(message.rollouts) == 1
    assert parse({"type": "sample", "v": 1, "n": 8}) == Sample(ref=None, n=8)
    report = parse({"type": "report", "v": 1, "round": 2, "reward_mean": 0.5, "loss": None, "used": []})
    assert isinstance(report, Report) and report.figures == {"reward_mean": 0.5, "loss": None}


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "invalid_json"),
        ("[1, 2]", "invalid_json"),
        ({"type": "hello"}, "unsupported_version"),
        ({"type": "hello", "v": 2}, "unsupported_version"),
        ({"type": "hello", "v": True}, "unsupported_version"),
        ({"type": "dance", "v": 1}, "unknown_type"),
        ({"v": 1}, "unknown_type"),
        ({"type": "hello", "v": 1, "ref": "x" * 65}, "invalid_message"),
        ({"type": "sample", "v": 1}, "invalid_message"),
        ({"type": "sample", "v": 1, "n": "3"}, "invalid_message"),
        ({"type": "sample", "v": 1, "n": 0}, "invalid_message"),
        ({"type": "sample", "v": 1, "n": 9}, "too_many_samples"),
        ({"type": "share", "v": 1, "rollouts": []}, "invalid_message"),
        ({"type": "share", "v": 1, "rollouts": [{}]}, "invalid_message"),
        (share(id="not-a-uuid"), "invalid_message"),
        (share(rewards=[1.0]), "invalid_message"),
        (share(rewards=[1.0, "0"]), "invalid_message"),
        (share(completions="text"), "invalid_message"),
        (share(completions=[]), "invalid_message"),
        (share(question=None), "invalid_message"),
        (share(round=-1), "invalid_message"),
        (share(question="a\u0000b"), "invalid_message"),
        (share(completions=["<answer>\ud800</answer>", "x"]), "invalid_message"),
        (share(completions=["a"] * 5, rewards=[0.0] * 5), "too_many_completions"),
        (share(completions=["a" * 501, "b"]), "completion_too_long"),
        (share(question="q" * 501), "completion_too_long"),
        ({"type": "share", "v": 1, "rollouts": [make_group() for _ in range(4)]}, "too_many_groups"),
        ({"type": "report", "v": 1}, "invalid_message"),
        ({"type": "report", "v": 1, "round": 1, "used": ["nope"]}, "invalid_message"),
        ({"type": "report", "v": 1, "round": 1, "loss": "low"}, "invalid_message"),
        ({"type": "report", "v": 1, "round": 1, "used": [make_group()["id"] for _ in range(6)]}, "too_many_used"),
        ({"type": "hello", "v": 1, "client": "x" * 30_000}, "frame_too_large"),
    ],
)
def test_refused_frames_have_their_code(frame, code):
    with pytest.raises(ProtocolError) as info:
        parse(frame)
    assert info.value.code == code


def test_nan_rewards_are_refused():
    frame = json.dumps(share()).replace('"rewards": [1.0, 0.0]', '"rewards": [NaN, 0.0]')
    assert "NaN" in frame
    with pytest.raises(ProtocolError) as info:
        parse(frame)
    assert info.value.code == "invalid_message"


@pytest.mark.parametrize(
    ("changes", "code", "detail"),
    [
        ({"completions": ["ok", "b" * 501, 7]}, "completion_too_long", "completions[1]: 501 characters"),
        ({"completions": ["ok", "fine", 7]}, "invalid_message", "completions[2]: expected a string"),
        ({"completions": ["ok", "a\u0000", "c"]}, "invalid_message", "completions[1]: NUL"),
        ({"rewards": [0.0, True]}, "invalid_message", "rewards[1]: expected a finite number"),
        ({"rewards": [1.0, 12345.5]}, "invalid_message", "rewards[1]: expected a finite number"),  # 1e999 below
    ],
)
def test_a_refused_completion_or_reward_is_named(changes, code, detail):
    if "rewards" not in changes:
        changes["rewards"] = [0.0] * len(changes["completions"])
    error = refusal(json.dumps(share(**changes)).replace("12345.5", "1e999"))  # a float literal, infinite
    assert error.code == code and detail in error.detail


def test_the_same_id_twice_in_one_share_is_refused():
    group = make_group()
    with pytest.raises(ProtocolError) as info:
        parse({"type": "share", "v": 1, "rollouts": [group, dict(group)]})
    assert info.value.code == "invalid_message"


def test_a_refusal_keeps_the_ref():
    with pytest.raises(ProtocolError) as info:
        parse({"type": "sample", "v": 1, "n": 0, "ref": "abc"})
    assert info.value.ref == "abc"


def refusal(text: str | bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_frame(text, LIMITS)
    return info.value


def nested(depth: int) -> str:
    """A report whose figure "x" holds arrays nested so that the whole frame is `depth` deep."""
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return '{"type": "report", "v": 1, "ref": "d", "round": 1, "x": ' + inner + "}"


def test_nesting_is_bounded_before_python_recursion_can_fail():
    # At the limit the frame parses (and "x" is refused as a figure, with the ref); one deeper is
    # invalid JSON whatever the interpreter's recursion limit, and so is an unclosed 19,000.
    at_limit = refusal(nested(MAX_NESTING))
    assert (at_limit.code, at_limit.ref, at_limit.detail) == ("invalid_message", "d", "x: expected a finite number")
    for depth in (MAX_NESTING + 1, 900, 5_000):
        error = refusal(nested(depth))
        assert error.code == "invalid_json" and f"deeper than {MAX_NESTING}" in error.detail
    assert refusal("[" * 19_000).code == "invalid_json"
    assert refusal("{" * 9_000).code == "invalid_json"


def test_the_nesting_check_finds_a_deep_value_wherever_it_hides():
    # Against the definition, on random values: a deep branch beside flat ones, in objects and arrays.
    def depth(value) -> int:
        if isinstance(value, dict | list):
            children = value.values() if isinstance(value, dict) else value
            return 1 + max(map(depth, children), default=0)
        return 0

    def value(rng: random.Random, left: int):
        kind = rng.random()
        if left == 0 or kind < 0.3:
            return rng.choice(["text", 7, 1.5, None, True])
        items = [value(rng, left - 1) for _ in range(rng.randint(0, 4))]
        return {f"k{i}": v for i, v in enumerate(items)} if kind < 0.65 else items

    rng = random.Random(11)
    for _ in range(2_000):
        v = value(rng, rng.randint(1, 22))
        if isinstance(v, dict | list):
            for limit in (1, 3, MAX_NESTING):
                assert messages._too_deep(v, limit) == (depth(v) > limit)


@pytest.mark.parametrize(
    ("field", "literal"),
    [
        ("round", "9" * 401),
        ("round", "1" * (MAX_INT_DIGITS + 1)),
        ("loss", "-" + "4" * 5000),
        ("loss", "1e400"),
        ("loss", "0." + "1" * 100),
        ("loss", "Infinity"),
        ("loss", "NaN"),
    ],
)
def test_numbers_out_of_range_are_refused_by_their_field_with_the_ref(field, literal):
    text = '{"type": "report", "v": 1, "ref": "n", "round": 1, "%s": %s}' % (field, literal)  # noqa: UP031
    if field == "round":
        text = text.replace('"round": 1, ', "")
    error = refusal(text)
    assert (error.code, error.ref) == ("invalid_message", "n")
    assert error.detail.startswith(field + ":") and "sys." not in error.detail


def test_the_largest_integers_a_frame_needs_still_parse():
    group = make_group()
    group["task"]["seed"] = -(10**19)  # 20 digits: refused by the range check, not the decoder
    with pytest.raises(ProtocolError) as info:
        parse({"type": "share", "v": 1, "rollouts": [group]})
    assert "expected an integer in" in info.value.detail
    group["task"]["seed"] = 2**62
    assert isinstance(parse({"type": "share", "v": 1, "rollouts": [group]}), Share)


def test_binary_frames_are_read_as_utf8():
    assert parse_frame(b'{"type": "sample", "v": 1, "n": 2}', LIMITS) == Sample(ref=None, n=2)
    error = refusal(b'{"type": "sample", "v": 1, "n": 2, "ref": "\xff"}')
    assert (error.code, error.detail) == ("invalid_json", "not UTF-8 text")


def test_a_frame_over_the_limit_keeps_its_ref_within_the_websocket_headroom():
    error = refusal(json.dumps({"type": "hello", "v": 1, "ref": "r", "client": "x" * 30_000}))
    assert (error.code, error.ref) == ("frame_too_large", "r")
    huge = json.dumps({"type": "hello", "v": 1, "ref": "r", "client": "x" * (LIMITS.websocket_max_bytes + 1)})
    assert refusal(huge).ref is None  # not parsed at all


@pytest.mark.parametrize(
    ("frame", "ref"),
    [
        ('{"type": "share", "v": 1, "ref": "7", "rollouts": []}', "7"),  # as the node client writes it
        (b'{"type":"sample","v":1,"n":4,"ref":"s1"}', "s1"),
        ('{"type": "sample", "ref": "r3", "n": ', "r3"),  # read before any parsing: the tail is not looked at
        ('{"rollouts": [{"ref": "inner"}], "ref": "outer"}', None),  # after a nested value: not provably top-level
        ('{"type": "x", "note": {"ref": "inner"}}', None),
        ('{"ref": "a\\"b"}', None),  # escapes are not decoded: no ref
        ('{"ref": "' + "x" * 65 + '"}', None),  # longer than a ref may be
        ("junk", None),
        (None, None),
    ],
)
def test_the_leading_ref_is_read_without_parsing_and_only_when_top_level(frame, ref):
    assert leading_ref(frame) == ref


def test_the_leading_ref_looks_at_the_first_characters_only():
    assert leading_ref('{"type": "share", "v": 1, "ref": "r", "rollouts": [' + "x" * 10**6) == "r"
    assert leading_ref('{"type": "' + "a" * 300 + '", "ref": "r"}') is None


# --- The typed path of a share (sockets.messages._typed_share) ------------------------------------------


def _general(text: str | bytes, limits: Limits) -> object:
    """What the general path makes of a frame: its message, or the ProtocolError it raises."""
    try:
        return messages._parse_any(text, limits)
    except ProtocolError as exc:
        return exc


def _same_share(typed: Share, general: object) -> bool:
    """The same Share, rewards compared by their text too (0.0 and -0.0 are equal as numbers but are
    stored as the node sent them)."""
    return (
        isinstance(general, Share)
        and typed == general
        and [list(map(repr, r.rewards)) for r in typed.rollouts]
        == [list(map(repr, r.rewards)) for r in general.rollouts]
    )


def _edge_frames() -> list[str]:
    """Shares at the edges the typed path must read as the general one does, or leave to it."""
    group = json.dumps(make_group(right=1, wrong=1))
    base = '{"type": "share", "v": 1, "ref": "e", "rollouts": [' + group + "]}"
    uid = json.loads(group)["id"]
    rewards = '"rewards": [1.0, 0.0]'
    frames = [base, base.replace('"ref": "e", ', ""), base.replace('"ref": "e"', '"ref": null')]
    for literal in [
        "-0",
        "-0.0",
        "0",
        "1",
        "1e2",
        "1E-400",
        "0.1",
        "0." + "1" * 62,
        "0." + "1" * 63,
        "1" * 20,
        "1" * 21,
        "-" + "9" * 20,
        "3" * 20,
        str(2**64),
        str(2**63 + 1),
        "9" * 19 + ".5",
        "1e19",
        "1e20",
        "1e300",
        "1e400",
        "NaN",
        "true",
        '"1"',
        "[1]",
        "null",
    ]:
        frames.append(base.replace(rewards, f'"rewards": [1.0, {literal}]'))
        frames.append(base.replace(rewards, f'"rewards": [ {literal} , 0.0 ]'))
    for seed in ["-1", str(2**62), str(2**62 + 1), "1" * 21, "1.0", "true", '"1"']:
        frames.append(base.replace('"seed": ', f'"seed": {seed}, "_was": '))  # the old seed becomes an extra key
        frames.append(re.sub(r'"seed": -?\d+', f'"seed": {seed}', base))
    for form in [uid.upper(), uid.replace("-", ""), "{" + uid + "}", "urn:uuid:" + uid, uid[:-1] + "g", uid + "0"]:
        frames.append(base.replace(uid, form))
    frames += [
        base.replace('"v": 1', '"v": true'),
        base.replace('"v": 1', '"v": 1.0'),
        base.replace('"type": "share"', '"type": "sample"'),
        base.replace('"ref": "e"', '"ref": "e", "extra": 1'),
        base.replace('"question": ', '"question": "first", "question": '),  # the last one counts, in both
        base.replace('"question": ', '"qu\\u0065stion": '),
        base.replace('"answer": ', '"answer": null, "_answer": '),
        base.replace('"completions": [', '"completions": ["a\\u0000b", '),
        base.replace('"completions": [', '"completions": ["\\ud800", '),
        base.replace('"completions": [', '"completions": ["\\ud83d\\ude00 \u00e9", '),
        base.replace('"ref": "e"', '"ref": "' + "r" * 65 + '"'),
        base.replace(group, group + ", " + group),  # one id twice
        base.replace(group, ", ".join(json.dumps(make_group()) for _ in range(4))),  # over the small limits' 3
        base.replace(group, json.dumps(make_group(right=3, wrong=2))),  # 5 completions: over the small limits' 4
        base.replace('"rollouts": [', '"rollouts": [' + "[" * 50_000 + "]" * 50_000 + ", "),
        "\ufeff" + base,
        base + " ",
        base + " x",
    ]
    proved = json.loads(group)
    proved["proof"] = _proof()
    with_proof = base.replace(group, json.dumps(proved))
    frames += [
        with_proof,
        with_proof.replace('"model": "tiny-mini"', '"model": "tiny-mini", "extra": 1'),
        with_proof.replace('"temperature": 0.7', '"temperature": 1'),
        with_proof.replace('"temperature": 0.7', '"temperature": 1e400'),
        with_proof.replace('"temperature": 0.7', '"temperature": 10.000001'),
        with_proof.replace('"model": "tiny-mini"', '"model": "tiny\\u0000"'),
        with_proof.replace('"model": "tiny-mini"', '"model": "caf\u00e9"'),
        with_proof.replace('"challenge": "', '"challenge": "\\u0007'),
        base.replace('"answer": ', '"proof": null, "answer": '),
    ]
    return frames


@pytest.mark.parametrize("limits", [LIMITS, Limits()], ids=["small limits", "default limits"])
def test_the_typed_path_takes_only_what_the_general_path_takes(limits):
    """Every frame the typed path reads is read to the same Share by the general path; every frame the
    general path refuses, the typed path leaves to it (answering None). On the fuzzer's frames (valid
    shares mutated: hostile literals, keys dropped and added, texts cut and spliced) and at the edges."""
    groups = fuzz.honest_groups(12, seed=4)
    frames = [frame.data for frame in fuzz.hostile_frames(7, 3000, groups)] + _edge_frames()
    typed_count = refused = 0
    for text in frames:
        typed = messages._typed_share(text, limits)
        general = _general(text, limits)
        if isinstance(general, ProtocolError):
            refused += 1
        if typed is not None:
            typed_count += 1
            assert _same_share(typed, general), text[:300]
    assert typed_count >= 300 and refused >= 1000  # both kinds are well represented


def test_a_node_clients_share_takes_the_typed_path():
    """What sapo-node sends (Group.to_wire in protocol.frame) is read by the typed path, to the Share
    the general path reads."""
    from sapo_node import protocol
    from sapo_node.groups import Group
    from sapo_node.tasks import TaskRef

    sent = [
        Group.new(
            round=3,
            task=TaskRef("basic_arithmetic", 7, i),
            question=f"What is {i} + 1?",
            answer=str(i + 1),
            completions=[f"so <answer>{i + 1}</answer>", "no idea", "caf\u00e9 \U0001f600 <answer>2</answer>"],
            rewards=[1.0, 0.0, float(i == 1)],
        ).to_wire()
        for i in range(3)
    ]
    text = json.dumps(protocol.frame(protocol.SHARE, ref="s1", rollouts=sent))
    typed = messages._typed_share(text, LIMITS)
    assert typed is not None and _same_share(typed, messages._parse_any(text, LIMITS))
    assert parse_frame(text, LIMITS) == typed
    assert parse_frame(text.encode(), LIMITS) == typed  # a binary frame of the same text
    assert [str(r.id) for r in typed.rollouts] == [g["id"] for g in sent]


# --- A group's proof of work (docs/protocol.md, "Proof of work") --------------------------------------


def _proof(count: int = 2, tokens: int = 3, **changes) -> dict:
    """A well-formed proof for a group of `count` completions of `tokens` tokens each."""
    from sapo_node import proof

    value = {
        "challenge": "c1.7.1764650000000.00112233aabbccdd." + "ab" * 16,
        "weights": "0123456789abcdef" * 4,
        "model": "tiny-mini",
        "temperature": 0.7,
        "tokens": [proof.encode_ids(list(range(k, k + tokens))) for k in range(count)],
        "logprobs": [proof.encode_floats([-0.5] * tokens) for _ in range(count)],
    }
    value.update(changes)
    return value


def test_a_groups_proof_is_read_whole_by_both_paths_and_an_old_clients_group_has_none():
    from sapo_node import proof

    text = json.dumps(share(proof=_proof()))
    typed, general = messages._typed_share(text, LIMITS), _general(text, LIMITS)
    assert typed is not None and _same_share(typed, general)
    got = typed.rollouts[0].proof
    assert got is not None and got.model == "tiny-mini" and got.temperature == 0.7
    assert proof.decode_ids(got.tokens[1]) == [1, 2, 3] and proof.decode_floats(got.logprobs[0]) == [-0.5] * 3
    assert parse(share()).rollouts[0].proof is None
    assert parse(share(proof=None)).rollouts[0].proof is None


_TOKEN = "AQAAAA=="  # one uint32 token id (1)
_LOGPROB = "AAAAvw=="  # one float32 log-probability (-0.5)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"challenge": ""}, "challenge"),
        ({"challenge": "c" * 129}, "challenge"),
        ({"challenge": "c1.\u00e9"}, "challenge"),
        ({"challenge": 7}, "challenge"),
        ({"weights": "0123456789ABCDEF" * 4}, "weights"),
        ({"weights": "ab" * 31}, "weights"),
        ({"weights": None}, "weights"),
        ({"model": "m" * 201}, "model"),
        ({"model": ""}, "model"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 10.5}, "temperature"),
        ({"temperature": "0.7"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"tokens": [_TOKEN]}, "tokens"),  # one entry for two completions
        ({"logprobs": [_LOGPROB, _LOGPROB, _LOGPROB]}, "logprobs"),
        ({"tokens": [_TOKEN, 5]}, "tokens"),
        ({"tokens": [_TOKEN, "not base64!"]}, "tokens[1]"),
        ({"tokens": [_TOKEN, "AQAA"]}, "tokens[1]"),  # 3 bytes: not whole uint32s
        ({"tokens": [_TOKEN, ""]}, "tokens[1]"),  # no token at all
        ({"tokens": [_TOKEN, "AQAAAA"]}, "tokens[1]"),  # padding missing
        ({"tokens": [_TOKEN, "AQ!AAA=="]}, "tokens[1]"),  # a character outside the alphabet
        ({"tokens": [_TOKEN, "AQAAAA==AQAAAA=="]}, "tokens[1]"),  # data after the padding
        ({"tokens": [_TOKEN, "AQAA\u00e9AA="]}, "tokens[1]"),  # not ASCII
        ({"logprobs": [_LOGPROB, "AAAAvwAAAL8="]}, "logprobs[1]"),  # two log-probabilities for one token
        ({"logprobs": [_LOGPROB, "AADAfw=="]}, "logprobs[1]"),  # NaN
        ({"logprobs": [_LOGPROB, "AACA/w=="]}, "logprobs[1]"),  # -inf
        ({"logprobs": [_LOGPROB, "AAAAPw=="]}, "logprobs[1]"),  # 0.5: a probability above 1
        ({"logprobs": [_LOGPROB, "YEKiDQ=="]}, "logprobs[1]"),  # 1e-30: above 0 all the same
        ({"tokens": None}, "tokens"),
    ],
)
def test_a_malformed_proof_is_refused_by_its_field(changes, field):
    base = _proof(tokens=1)
    if "tokens" not in changes:
        base["tokens"] = [_TOKEN, _TOKEN]
    if "logprobs" not in changes:
        base["logprobs"] = [_LOGPROB, _LOGPROB]
    assert parse(share(proof=base))  # the base is valid
    text = json.dumps(share(proof={**base, **changes}))
    with pytest.raises(ProtocolError) as caught:
        parse_frame(text, LIMITS)
    assert caught.value.code == "invalid_message"
    assert caught.value.detail.startswith(f"rollouts[0].proof.{field}"), caught.value.detail
    assert messages._typed_share(text, LIMITS) is None


def test_a_proofs_log_probability_of_a_certain_token_is_zero_and_accepted():
    from sapo_node import proof

    base = {**_proof(tokens=1), "tokens": [_TOKEN, _TOKEN], "logprobs": ["AAAAAA==", "AAAAgA=="]}  # 0.0, -0.0
    got = parse(share(proof=base)).rollouts[0].proof
    assert [proof.decode_floats(x) for x in got.logprobs] == [[0.0], [-0.0]]
    assert messages._typed_share(json.dumps(share(proof=base)), LIMITS) is not None


def test_a_proofs_token_count_is_bounded_by_the_completion_bound():
    at_bound = _proof(tokens=LIMITS.max_chars_per_completion + 1)
    assert parse(share(proof=at_bound)).rollouts[0].proof is not None
    over = _proof(tokens=LIMITS.max_chars_per_completion + 2)
    with pytest.raises(ProtocolError, match=r"rollouts\[0\]\.proof\.tokens\[0\]"):
        parse(share(proof=over))
    missing = {k: v for k, v in _proof().items() if k != "logprobs"}
    with pytest.raises(ProtocolError, match=r"proof\.logprobs"):
        parse(share(proof=missing))
    with pytest.raises(ProtocolError, match=r"proof: expected an object"):
        parse(share(proof=[1]))
