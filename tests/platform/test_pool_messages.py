"""Frame validation (pure): every refusal has its protocol code."""

from __future__ import annotations

import json

import pytest
from test_pool_support import make_group

from pool.limits import Limits
from pool.messages import Hello, ProtocolError, Report, Sample, Share, parse_frame

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


def test_the_same_id_twice_in_one_share_is_refused():
    group = make_group()
    with pytest.raises(ProtocolError) as info:
        parse({"type": "share", "v": 1, "rollouts": [group, dict(group)]})
    assert info.value.code == "invalid_message"


def test_a_refusal_keeps_the_ref():
    with pytest.raises(ProtocolError) as info:
        parse({"type": "sample", "v": 1, "n": 0, "ref": "abc"})
    assert info.value.ref == "abc"
