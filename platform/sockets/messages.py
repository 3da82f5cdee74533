"""Parsing and validating the node protocol's frames (docs/protocol.md), with no I/O.

`parse_frame(text, limits)` turns one WebSocket text frame into a typed message or raises
`ProtocolError(code, detail, ref)` with the protocol's error code. Nothing here touches the database:
a frame that fails here is answered with an `error` and nothing in it is stored.

Every frame is untrusted: nothing in it may make the parser raise anything but ProtocolError. The
JSON decoder is bounded (_decode): nesting deeper than MAX_NESTING, integers longer than
MAX_INT_DIGITS (Python's int() raises past 4,300 digits and is quadratic below that) and the
non-JSON constants NaN/Infinity never become values; an oversized number is kept as a marker so the
frame still parses, its `ref` is still read, and the field holding it is refused by its type check.

A share, most frames and nearly all their bytes, is first read by a typed path (msgspec against the
share's types, in C; `_typed_share`, at the end) that takes only valid shares and leaves every other
frame to the general path above, whose errors are the protocol's.
"""

from __future__ import annotations

import binascii
import json
import math
import re
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from pool.limits import Limits
from pool.records import Report, RolloutIn
from sapo_node import proof as proof_of_work
from sapo_node import protocol
from sapo_node.protocol import WireGroup, WireProof, WireTask

PROTOCOL_VERSION = protocol.VERSION
MAX_REF_CHARS = 64
MAX_DATASET_CHARS = 64
MAX_HELLO_CHARS = 200
MAX_SWARM_CHARS = 40
_SWARM_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
MAX_FIGURES = 32
MAX_FIGURE_NAME_CHARS = 64
#: Arrays and objects inside each other; a valid frame needs 4 (share > rollouts > group > task).
MAX_NESTING = 16
#: Digits of an integer literal (a sign aside); every integer field fits a PostgreSQL bigint (19).
MAX_INT_DIGITS = 20
#: Characters of a number literal with a fraction or exponent (a double needs at most 24).
MAX_FLOAT_CHARS = 64
# Seeds and indices outside the task range are a verdict (bad_index), not a malformed frame, but they
# must still fit a PostgreSQL bigint; rounds fit an int.
MAX_STORED_INT = 2**62
MAX_ROUND = 2**31 - 1


class ProtocolError(Exception):
    """A frame the server refuses; `code` is one of the protocol's error codes."""

    def __init__(self, code: str, detail: str, ref: str | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.ref = ref


@dataclass(frozen=True)
class Hello:
    ref: str | None
    client: str
    model: str
    hardware: str
    local: int | None
    external: int | None
    #: The swarm's slug, protocol.ANY_SWARM, or None: the site's default swarm.
    swarm: str | None = None
    #: The node answers held-out checks (`hello.heldout` true); an older client never says so.
    heldout: bool = False


@dataclass(frozen=True)
class Share:
    ref: str | None
    rollouts: tuple[RolloutIn, ...]


@dataclass(frozen=True)
class Sample:
    ref: str | None
    n: int


@dataclass(frozen=True)
class Status:
    ref: str | None
    #: One of protocol.NODE_STATES.
    state: str
    #: The node's pause reasons (protocol.PAUSE_SITE among them once it holds the site's pause).
    paused_for: tuple[str, ...]
    round_seconds: float | None
    tokens_per_second: float | None
    #: While preparing: one of protocol.PREPARING_STEPS ("" when not said), its progress (0 to 1) and ETA.
    preparing: str = ""
    progress: float | None = None
    eta_seconds: float | None = None


@dataclass(frozen=True)
class HeldoutAnswers:
    ref: str | None
    check: uuid.UUID
    round: int
    #: (question id, answer text), in the frame's order; ids not yet checked against what was asked.
    answers: tuple[tuple[int, str], ...]


Message = Hello | Share | Sample | Report | Status | HeldoutAnswers


class _Unrepresentable:
    """What the decoder puts where a number may not go (too long, NaN, Infinity): not an int or a
    float, so every field check refuses it with the field's own path."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<number out of range>"


_UNREPRESENTABLE = _Unrepresentable()


def _parse_int(text: str) -> int | _Unrepresentable:
    return int(text) if len(text.lstrip("-")) <= MAX_INT_DIGITS else _UNREPRESENTABLE


def _parse_float(text: str) -> float | _Unrepresentable:
    return float(text) if len(text) <= MAX_FLOAT_CHARS else _UNREPRESENTABLE


def _parse_constant(text: str) -> _Unrepresentable:
    return _UNREPRESENTABLE  # NaN, Infinity, -Infinity: Python's json accepts them, JSON does not


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)


_CONTAINERS = frozenset({dict, list})  # what the decoder makes of arrays and objects (never a subclass)


def _too_deep(value: Any, limit: int) -> bool:
    """Whether arrays/objects nest deeper than `limit` (iterative: the value may be ~1,000 deep). A
    container holding none (a group's completions, its task) is passed over by one set test on its
    items' types: half the time of looking at each item in Python."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item
        if _CONTAINERS.isdisjoint(map(type, children)):
            continue
        for child in children:
            if type(child) in _CONTAINERS:
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def _decode(text: str | bytes) -> Any:
    """JSON text to a value, or ProtocolError(protocol.INVALID_JSON); details never quote Python internals."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        data = _DECODER.decode(text)
    except UnicodeDecodeError:
        raise ProtocolError(protocol.INVALID_JSON, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ProtocolError(
            protocol.INVALID_JSON, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        # The C decoder counts its depth against the interpreter's recursion limit and raises
        # cleanly there (about 1,000 levels); shallower excess is caught by _too_deep below.
        raise ProtocolError(protocol.INVALID_JSON, f"arrays and objects nest deeper than {MAX_NESTING}") from None
    if isinstance(data, dict | list) and _too_deep(data, MAX_NESTING):
        raise ProtocolError(protocol.INVALID_JSON, f"arrays and objects nest deeper than {MAX_NESTING}")
    return data


def _valid_ref(data: Any) -> str | None:
    ref = data.get("ref") if isinstance(data, dict) else None
    return ref if isinstance(ref, str) and len(ref) <= MAX_REF_CHARS and _clean(ref) else None


# `"ref": "..."` among the first keys of the frame's object, after nothing but short scalar values (the
# node client writes type, v, ref first): nothing before it can hold a nested "ref", so it is a key of
# the top-level object.
_LEADING_REF = re.compile(
    r'\{\s*(?:"[a-z_]{1,32}"\s*:\s*(?:"[^"\\\x00-\x1f]{0,64}"|-?\d{1,20}|true|false|null)\s*,\s*){0,4}'
    r'"ref"\s*:\s*"([^"\\\x00-\x1f]{1,64})"'
)
#: Characters of a frame `leading_ref` looks at.
LEADING_REF_CHARS = 256


def leading_ref(text: str | bytes | None) -> str | None:
    """A frame's ref read without parsing the frame: for the frames refused before parsing (over the
    node's message or byte rate), whose cost must not grow with their size. Found only where the
    node client writes it: a top-level key after at most four keys of short scalar values, in the
    first LEADING_REF_CHARS characters."""
    if text is None:
        return None
    head = text[:LEADING_REF_CHARS]
    if isinstance(head, bytes):
        head = head.decode("utf-8", "replace")
    match = _LEADING_REF.match(head)
    return match.group(1) if match and _clean(match.group(1)) else None


def frame_size(text: str | bytes) -> int:
    """Bytes of the frame as it travelled (UTF-8; a lone surrogate counted as its 3 bytes)."""
    if isinstance(text, bytes) or text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


def parse_frame(text: str | bytes | None, limits: Limits) -> Message:
    """Validate one frame against the protocol and the limits; raise ProtocolError if it is refused.

    The error carries the frame's `ref` whenever the frame is a JSON object with a valid one (a frame
    over `max_frame_bytes` too, when it is within the WebSocket layer's headroom and parses).
    """
    if text is None:
        raise ProtocolError(protocol.INVALID_JSON, "empty frame")
    size = frame_size(text)
    if size > limits.max_frame_bytes:
        error = ProtocolError(protocol.FRAME_TOO_LARGE, f"frame is {size} bytes, the limit is {limits.max_frame_bytes}")
        if size <= limits.websocket_max_bytes:
            try:
                error.ref = _valid_ref(_decode(text))
            except ProtocolError:
                pass
        raise error
    share = _typed_share(text, limits)
    if share is not None:
        return share
    return _parse_any(text, limits)


def _parse_any(text: str | bytes, limits: Limits) -> Message:
    """`parse_frame` of a frame within the size limit, any type, valid or not: the general path, whose
    errors are the protocol's (a share the typed path took would be parsed here to the same Share)."""
    data = _decode(text)
    if not isinstance(data, dict):
        raise ProtocolError(protocol.INVALID_JSON, "a frame must be a JSON object")
    ref = data.get("ref")
    if ref is not None and _valid_ref(data) is None:
        raise ProtocolError(protocol.INVALID_MESSAGE, f"ref: expected a string of at most {MAX_REF_CHARS} characters")
    try:
        version = data.get("v")
        if type(version) is not int or version != PROTOCOL_VERSION:
            raise ProtocolError(protocol.UNSUPPORTED_VERSION, f"v must be {PROTOCOL_VERSION}")
        kind = data.get("type")
        parser = _PARSERS.get(kind) if isinstance(kind, str) else None
        if parser is None:
            shown = ascii(kind)[:60] if isinstance(kind, str) else "(not a string)"
            raise ProtocolError(protocol.UNKNOWN_TYPE, f"unknown message type {shown}")
        return parser(data, ref, limits)
    except ProtocolError as exc:
        exc.ref = ref
        raise


# Field helpers: each raises ProtocolError(protocol.INVALID_MESSAGE, "<path>: ...").

#: A key the object does not have: refused as null is, but for a group's `answer`, which must be there.
_ABSENT = object()


def _clean(value: str) -> bool:
    # PostgreSQL text cannot hold NUL, and lone surrogates (from JSON "\ud800") cannot be encoded.
    if "\x00" in value:
        return False
    if value.isascii():  # O(1) in CPython (a flag of the string): most texts skip the encoding below
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _invalid(path: str, what: str) -> ProtocolError:
    return ProtocolError(protocol.INVALID_MESSAGE, f"{path}: {what}")


def _int(data: dict[str, Any], key: str, path: str, lo: int, hi: int, *, required: bool = True) -> int | None:
    if data.get(key) is None and not required:
        return None
    return _int_value(data.get(key), path + key, lo, hi)


def _int_value(value: Any, path: str, lo: int, hi: int) -> int:
    if value is None or value is _ABSENT:
        raise _invalid(path, "required")
    if type(value) is not int:
        raise _invalid(path, "expected an integer")
    if not lo <= value <= hi:
        raise _invalid(path, f"expected an integer in [{lo}, {hi}]")
    return value


def _text(value: Any, path: str, max_chars: int, code: str = protocol.INVALID_MESSAGE) -> str:
    if not isinstance(value, str):
        raise _invalid(path, "expected a string")
    if len(value) > max_chars:
        raise ProtocolError(code, f"{path}: {len(value)} characters, the limit is {max_chars}")
    if not _clean(value):
        raise _invalid(path, "NUL characters and unpaired surrogates are not allowed")
    return value


_NUMBER_TYPES = {int, float}
_STR_TYPE = {str}


def _number(value: Any, path: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise _invalid(path, "expected a finite number")
    return float(value)


def _uuid(value: Any, path: str) -> uuid.UUID:
    if not isinstance(value, str) or len(value) > 45:
        raise _invalid(path, "expected a UUID string")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _invalid(path, "expected a UUID string") from None


def _parse_hello(data: dict[str, Any], ref: str | None, limits: Limits) -> Hello:
    texts = {}
    for key in ("client", "model", "hardware"):
        value = data.get(key, "")
        texts[key] = "" if value is None else _text(value, key, MAX_HELLO_CHARS, protocol.INVALID_MESSAGE)
    swarm = data.get("swarm")
    if swarm is not None and (not isinstance(swarm, str) or not _SWARM_RE.fullmatch(swarm)):
        raise _invalid("swarm", f"expected a swarm's slug (1-{MAX_SWARM_CHARS} lowercase letters, digits, hyphens)")
    heldout = data.get("heldout", False)
    if heldout is not None and not isinstance(heldout, bool):
        raise _invalid("heldout", "expected true or false")
    return Hello(
        ref=ref,
        heldout=bool(heldout),
        local=_int(data, "local", "", 0, 10_000, required=False),
        external=_int(data, "external", "", 0, 10_000, required=False),
        swarm=swarm,
        **texts,
    )


# The general path's check of each field of a group, keyed by sapo_node.protocol.WireGroup's fields (and
# the task's by WireTask's): each takes the field's value (_ABSENT when the key is missing), its path in
# the frame, the limits and the fields checked before it, and answers the value as RolloutIn holds it or
# raises ProtocolError. Run in this order, which decides the error of a group with several faults.


def _check_task(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(path, "expected an object")
    fields: dict[str, Any] = {}
    for name, check in _TASK_CHECKS.items():
        fields[name] = check(value.get(name, _ABSENT), f"{path}.{name}", limits, fields)
    return fields


def _check_dataset(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_DATASET_CHARS or not _clean(value):
        raise _invalid(path, f"expected a name of 1 to {MAX_DATASET_CHARS} characters")
    return value


def _check_stored_int(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> int:
    return _int_value(value, path, -MAX_STORED_INT, MAX_STORED_INT)


def _check_question(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> str:
    return _text(value, path, limits.max_chars_per_completion, protocol.COMPLETION_TOO_LONG)


def _check_answer(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> str | None:
    if value is _ABSENT:
        raise _invalid(path, "required (null when the task has no single answer)")
    if value is None:
        return None
    return _text(value, path, limits.max_chars_per_completion, protocol.COMPLETION_TOO_LONG)


def _check_completions(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise _invalid(path, "expected a non-empty list of strings")
    if len(value) > limits.max_completions_per_group:
        raise ProtocolError(
            protocol.TOO_MANY_COMPLETIONS,
            f"{path}: {len(value)} completions, the limit is {limits.max_completions_per_group}",
        )
    max_chars = limits.max_chars_per_completion
    # The whole list checked at once when it is valid (nearly always); otherwise one by one, so the error
    # names the first completion at fault.
    if set(map(type, value)) == _STR_TYPE and max(map(len, value)) <= max_chars and _clean("".join(value)):
        return tuple(value)
    return tuple(_text(c, f"{path}[{i}]", max_chars, protocol.COMPLETION_TOO_LONG) for i, c in enumerate(value))


def _check_rewards(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise _invalid(path, "expected a list of numbers")
    if len(value) != len(checked["completions"]):
        raise _invalid(path, "expected one reward per completion")
    numbers = tuple(map(float, value)) if set(map(type, value)) <= _NUMBER_TYPES else ()
    if numbers and all(map(math.isfinite, numbers)):
        return numbers
    return tuple(_number(r, f"{path}[{i}]") for i, r in enumerate(value))


_WEIGHTS_RE = re.compile(f"[0-9a-f]{{{proof_of_work.DIGEST_HEX_CHARS}}}")
#: A proof's fields in the order the general path checks them (which decides the error of a proof with
#: several faults).
_PROOF_FIELDS = ("challenge", "weights", "model", "temperature", "tokens", "logprobs")
assert set(_PROOF_FIELDS) == set(WireProof.__struct_fields__), "a check for each field of WireProof"


def _check_proof(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> WireProof | None:
    """A group's proof of work (docs/protocol.md, "Proof of work"), or None when it has none. Its
    challenge is not checked here (an expired or foreign one is a verdict on the credit, not a malformed
    frame: pool.challenges), only its form and bounds."""
    if value is _ABSENT or value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid(path, "expected an object or null")
    fields = {name: value.get(name, _ABSENT) for name in _PROOF_FIELDS}
    challenge, weights, model = fields["challenge"], fields["weights"], fields["model"]
    if not isinstance(challenge, str) or not 1 <= len(challenge) <= proof_of_work.MAX_CHALLENGE_CHARS:
        raise _invalid(f"{path}.challenge", f"expected a string of 1 to {proof_of_work.MAX_CHALLENGE_CHARS} characters")
    if not challenge.isascii() or not challenge.isprintable():
        raise _invalid(f"{path}.challenge", "expected printable ASCII characters")
    if not isinstance(weights, str) or not _WEIGHTS_RE.fullmatch(weights):
        raise _invalid(f"{path}.weights", f"expected {proof_of_work.DIGEST_HEX_CHARS} lowercase hex characters")
    if not isinstance(model, str) or not 1 <= len(model) <= protocol.PROOF_MAX_MODEL_CHARS or not _clean(model):
        raise _invalid(f"{path}.model", f"expected a name of 1 to {protocol.PROOF_MAX_MODEL_CHARS} characters")
    temperature = fields["temperature"]
    if type(temperature) not in _NUMBER_TYPES or not 0 <= temperature <= protocol.PROOF_MAX_TEMPERATURE:
        raise _invalid(f"{path}.temperature", f"expected a number in [0, {protocol.PROOF_MAX_TEMPERATURE:g}]")
    count = len(checked["completions"])
    lists = {}
    for name in ("tokens", "logprobs"):
        items = fields[name]
        if not isinstance(items, list) or len(items) != count or set(map(type, items)) - _STR_TYPE:
            raise _invalid(f"{path}.{name}", "expected one string per completion")
        lists[name] = items
    fault = _proof_fault(lists["tokens"], lists["logprobs"], limits.max_chars_per_completion)
    if fault is not None:
        raise _invalid(f"{path}.{fault[0]}", fault[1])
    return WireProof(
        challenge=challenge,
        weights=weights,
        model=model,
        temperature=float(temperature),
        tokens=lists["tokens"],
        logprobs=lists["logprobs"],
    )


def _b64_chars(n: int) -> int:
    """Characters of the base64 of `n` 4-byte words."""
    return 4 * ((4 * n + 2) // 3)


def _b64_words(text: str) -> bytes | None:
    """The bytes of base64 text that decodes to whole 4-byte words (at least one), else None. Decoded
    leniently (half the time of binascii's strict mode, which is most of a proof's check), then held to
    the length its characters must decode to: a character outside the alphabet, dropped by the lenient
    decoder, or anything after the padding, where it stops, leaves fewer bytes."""
    if not text.isascii() or len(text) % 4:
        return None
    try:
        raw = binascii.a2b_base64(text)
    except binascii.Error:
        return None
    padding = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    if len(raw) != len(text) // 4 * 3 - padding:
        return None
    return raw if raw and not len(raw) % 4 else None


def _proof_fault(tokens: list[str], logprobs: list[str], max_tokens: int) -> tuple[str, str] | None:
    """Why a proof's per-completion strings are malformed, as (field with its index, what), or None: each
    base64 of whole little-endian 4-byte words (sapo_node.proof's encodings), at most `max_tokens` + 1
    tokens a completion (the completion's character bound, and its EOS), as many log-probabilities as
    tokens, each finite and at most 0 (a probability's logarithm; a sampling node weighs the completion by
    them, sapo_node.grpo.importance_weights)."""
    longest = _b64_chars(max_tokens + 1)
    for k, (ids, floats) in enumerate(zip(tokens, logprobs, strict=True)):
        raw_ids = _b64_words(ids) if len(ids) <= longest else None
        if raw_ids is None or len(raw_ids) > 4 * (max_tokens + 1):
            return f"tokens[{k}]", f"expected base64 of 1 to {max_tokens + 1} little-endian uint32 token ids"
        raw_floats = _b64_words(floats) if len(floats) == len(ids) else None
        if raw_floats is None or len(raw_floats) != len(raw_ids):
            return f"logprobs[{k}]", "expected base64 of one little-endian float32 log-probability per token"
        # A sum of float32 values widened to doubles is finite exactly when each value is (a float32 is
        # at most 3.4e38 and there are at most a few thousand). The cast reads the machine's byte
        # order: little-endian on every platform the server runs on.
        values = memoryview(raw_floats).cast("f")
        if not math.isfinite(sum(values)) or max(values) > 0.0:
            return f"logprobs[{k}]", "expected finite log-probabilities, each at most 0"
    return None


def _check_id(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> uuid.UUID:
    return _uuid(value, path)


def _check_round(value: Any, path: str, limits: Limits, checked: dict[str, Any]) -> int:
    return _int_value(value, path, 0, MAX_ROUND)


_TASK_CHECKS = {"dataset": _check_dataset, "seed": _check_stored_int, "index": _check_stored_int}
_GROUP_CHECKS = {
    "task": _check_task,
    "question": _check_question,
    "answer": _check_answer,
    "completions": _check_completions,
    "rewards": _check_rewards,
    "id": _check_id,
    "round": _check_round,
    "proof": _check_proof,
}
assert set(_TASK_CHECKS) == set(WireTask.__struct_fields__), "a check for each field of WireTask"
assert set(_GROUP_CHECKS) == set(WireGroup.__struct_fields__), "a check for each field of WireGroup"


def _parse_rollout(item: Any, path: str, limits: Limits) -> RolloutIn:
    if not isinstance(item, dict):
        raise _invalid(path, "expected an object")
    checked: dict[str, Any] = {}
    for name, check in _GROUP_CHECKS.items():
        checked[name] = check(item.get(name, _ABSENT), f"{path}.{name}", limits, checked)
    return RolloutIn(**checked.pop("task"), **checked)


def _parse_share(data: dict[str, Any], ref: str | None, limits: Limits) -> Share:
    items = data.get("rollouts")
    if not isinstance(items, list) or not items:
        raise _invalid("rollouts", "expected a non-empty list")
    if len(items) > limits.max_groups_per_message:
        raise ProtocolError(
            protocol.TOO_MANY_GROUPS, f"rollouts: {len(items)} groups, the limit is {limits.max_groups_per_message}"
        )
    rollouts = tuple(_parse_rollout(item, f"rollouts[{i}]", limits) for i, item in enumerate(items))
    if len({r.id for r in rollouts}) != len(rollouts):
        raise _invalid("rollouts", "the same id appears twice in one share")
    return Share(ref=ref, rollouts=rollouts)


def _parse_sample(data: dict[str, Any], ref: str | None, limits: Limits) -> Sample:
    n = data.get("n")
    if type(n) is not int or n < 1:
        raise _invalid("n", "expected a positive integer")
    if n > limits.max_sample_n:
        raise ProtocolError(protocol.TOO_MANY_SAMPLES, f"n: {n}, the limit is {limits.max_sample_n}")
    return Sample(ref=ref, n=n)


_REPORT_RESERVED = {"type", "v", "ref", "round", "used"}


def _parse_report(data: dict[str, Any], ref: str | None, limits: Limits) -> Report:
    round_ = _int(data, "round", "", 0, MAX_ROUND)
    used = data.get("used", [])
    if not isinstance(used, list):
        raise _invalid("used", "expected a list of rollout ids")
    if len(used) > limits.max_used_per_report:
        raise ProtocolError(protocol.TOO_MANY_USED, f"used: {len(used)} ids, the limit is {limits.max_used_per_report}")
    used_ids = tuple(dict.fromkeys(_uuid(u, f"used[{i}]") for i, u in enumerate(used)))
    figures: dict[str, float | None] = {}
    for key, value in data.items():
        if key in _REPORT_RESERVED:
            continue
        if len(figures) >= MAX_FIGURES:
            raise _invalid("report", f"at most {MAX_FIGURES} figures")
        if len(key) > MAX_FIGURE_NAME_CHARS or not _clean(key):
            raise _invalid("report", f"figure names have at most {MAX_FIGURE_NAME_CHARS} characters")
        figures[key] = None if value is None else _number(value, key)
    return Report(ref=ref, round=round_, figures=figures, used=used_ids)


def _bounded_number(data: dict[str, Any], key: str, hi: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    number = _number(value, key)
    if not 0 <= number <= hi:
        raise _invalid(key, f"expected a number in [0, {hi:g}]")
    return number


def _parse_status(data: dict[str, Any], ref: str | None, limits: Limits) -> Status:
    state = data.get("state")
    if state not in protocol.NODE_STATES:
        raise _invalid("state", f"expected one of {', '.join(protocol.NODE_STATES)}")
    reasons = data.get("paused_for", [])
    if not isinstance(reasons, list) or len(reasons) > protocol.MAX_PAUSE_REASONS:
        raise _invalid("paused_for", f"expected a list of at most {protocol.MAX_PAUSE_REASONS} reasons")
    for i, reason in enumerate(reasons):
        if not isinstance(reason, str) or not 0 < len(reason) <= protocol.MAX_PAUSE_REASON_CHARS or not _clean(reason):
            raise _invalid(f"paused_for[{i}]", f"expected a reason of 1-{protocol.MAX_PAUSE_REASON_CHARS} characters")
    preparing = data.get("preparing")
    if preparing is not None and preparing not in protocol.PREPARING_STEPS:
        raise _invalid("preparing", f"expected one of {', '.join(protocol.PREPARING_STEPS)}")
    return Status(
        ref=ref,
        state=state,
        paused_for=tuple(dict.fromkeys(reasons)),
        round_seconds=_bounded_number(data, "round_seconds", protocol.MAX_ROUND_SECONDS),
        tokens_per_second=_bounded_number(data, "tokens_per_second", protocol.MAX_TOKENS_PER_SECOND),
        preparing=preparing or "",
        progress=_bounded_number(data, "progress", 1.0),
        eta_seconds=_bounded_number(data, "eta_seconds", protocol.MAX_ROUND_SECONDS),
    )


def _parse_heldout_answers(data: dict[str, Any], ref: str | None, limits: Limits) -> HeldoutAnswers:
    answers = data.get("answers")
    if not isinstance(answers, list) or not 0 < len(answers) <= protocol.HELDOUT_MAX_QUESTIONS:
        raise _invalid("answers", f"expected a list of 1-{protocol.HELDOUT_MAX_QUESTIONS} answers")
    parsed = []
    for i, item in enumerate(answers):
        if not isinstance(item, dict):
            raise _invalid(f"answers[{i}]", 'expected {"id", "text"}')
        question = _int_value(item.get("id", _ABSENT), f"answers[{i}].id", 0, protocol.HELDOUT_MAX_QUESTIONS - 1)
        text = _text(
            item.get("text"), f"answers[{i}].text", limits.max_chars_per_completion, protocol.COMPLETION_TOO_LONG
        )
        parsed.append((question, text))
    return HeldoutAnswers(
        ref=ref,
        check=_uuid(data.get("check"), "check"),
        round=_int_value(data.get("round", _ABSENT), "round", 0, MAX_ROUND),
        answers=tuple(parsed),
    )


_PARSERS = {
    protocol.HELLO: _parse_hello,
    protocol.SHARE: _parse_share,
    protocol.SAMPLE: _parse_sample,
    protocol.REPORT: _parse_report,
    protocol.STATUS: _parse_status,
    protocol.HELDOUT_ANSWERS: _parse_heldout_answers,
}
assert set(_PARSERS) == set(protocol.NODE_MESSAGES), "every node message type has a parser"


# --- The typed path of a share ----------------------------------------------------------------------
# Shares are most frames and nearly all their bytes. msgspec (C) decodes one into the protocol's Structs
# (sapo_node.protocol.WireGroup) in a fraction of the general path's time (JSON to Python values, then
# every field checked in Python; docs/benchmarks.md, "How ingest is made fast"); the checks that depend
# on the limits or on text content follow here. Whatever is not plainly a valid share (another
# message type, an unknown key, a wrong type, an escape msgspec refuses such as a lone surrogate, a
# failed check) makes `_typed_share` answer None, and the frame is parsed again the general way, whose
# errors are the protocol's. So this path accepts only frames the general one accepts, with the same
# Share (tests/platform/test_socket_messages.py compares the two on the fuzzer's frames); a refused frame
# costs one more linear pass. No schema here nests past four levels, and msgspec bounds the depth of
# what it passes over (a RecursionError, caught).


class _TypedTask(WireTask, forbid_unknown_fields=True):
    """WireTask, refusing a key it does not declare: msgspec would pass over its value, which the general
    path reads (and refuses if it nests past MAX_NESTING)."""


class _TypedProof(WireProof, forbid_unknown_fields=True):
    """WireProof, refusing a key it does not declare (as _TypedTask)."""


class _TypedGroup(WireGroup, forbid_unknown_fields=True):
    """WireGroup as the typed path decodes it: a key it does not declare refused (as by _TypedTask), the
    rewards kept as their JSON text (the general path refuses a number literal longer than
    MAX_FLOAT_CHARS, an integer of more than MAX_INT_DIGITS, which only the text shows: _typed_rewards)."""

    task: _TypedTask
    rewards: msgspec.Raw
    proof: _TypedProof | None = None


class _WireShare(msgspec.Struct, forbid_unknown_fields=True):
    type: str
    v: int
    rollouts: list[_TypedGroup]
    ref: str | None = None


_SHARE_DECODER = msgspec.json.Decoder(_WireShare)
_FLOATS_DECODER = msgspec.json.Decoder(list[float])
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, RecursionError)  # ValueError: UnicodeError too
#: Every integer literal of more than MAX_INT_DIGITS digits is at least this (JSON has no leading zeros).
_LONG_INT = 10.0**MAX_INT_DIGITS


def _typed_rewards(raw: msgspec.Raw, count: int) -> tuple[float, ...] | None:
    """A group's rewards (the JSON text of a list) as the general path reads them, or None when it
    might not: other than `count` numbers, a literal of more than MAX_FLOAT_CHARS characters (an
    integer of more than MAX_INT_DIGITS digits: caught by its size), a number as large as such an
    integer."""
    try:
        values = _FLOATS_DECODER.decode(raw)  # out of a double's range (1e400) refused
    except _DECODE_ERRORS:
        return None
    if len(values) != count:
        return None
    # With the brackets, a text of MAX_FLOAT_CHARS + 2 characters cannot hold a longer literal; a longer
    # text holds only numbers (decoded above), so its literals lie between commas.
    if len(raw) > MAX_FLOAT_CHARS + 2 and max(map(len, bytes(raw).split(b","))) > MAX_FLOAT_CHARS:
        return None
    if not -_LONG_INT < min(values) <= max(values) < _LONG_INT:  # a list of none fails the count above
        return None
    return tuple(values)


def _typed_proof(proof: _TypedProof, count: int, max_chars: int) -> WireProof | None:
    """A group's proof as the general path reads it (_check_proof), or None when it might not."""
    challenge = proof.challenge
    if not (
        1 <= len(challenge) <= proof_of_work.MAX_CHALLENGE_CHARS
        and challenge.isascii()
        and challenge.isprintable()
        and _WEIGHTS_RE.fullmatch(proof.weights)
        and 1 <= len(proof.model) <= protocol.PROOF_MAX_MODEL_CHARS
        and 0 <= proof.temperature <= protocol.PROOF_MAX_TEMPERATURE
        and len(proof.tokens) == count == len(proof.logprobs)
        and _proof_fault(proof.tokens, proof.logprobs, max_chars) is None
    ):
        return None
    return WireProof(
        challenge=challenge,
        weights=proof.weights,
        model=proof.model,
        temperature=proof.temperature,
        tokens=proof.tokens,
        logprobs=proof.logprobs,
    )


def _typed_share(text: str | bytes, limits: Limits) -> Share | None:
    """The Share of a frame that is a valid share, by the typed path (see above); None otherwise."""
    try:
        wire = _SHARE_DECODER.decode(text)
    except _DECODE_ERRORS:
        return None
    ref = wire.ref
    if (
        wire.type != protocol.SHARE
        or wire.v != PROTOCOL_VERSION
        or (ref is not None and (len(ref) > MAX_REF_CHARS or not _clean(ref)))
    ):
        return None
    groups = wire.rollouts
    if not groups or len(groups) > limits.max_groups_per_message:
        return None
    max_chars = limits.max_chars_per_completion
    max_completions = limits.max_completions_per_group
    texts: list[str] = []  # every text of the share, checked for NUL and lone surrogates at once
    rollouts = []
    for group in groups:
        task, question, answer, completions = group.task, group.question, group.answer, group.completions
        if not (
            1 <= len(task.dataset) <= MAX_DATASET_CHARS
            and -MAX_STORED_INT <= task.seed <= MAX_STORED_INT
            and -MAX_STORED_INT <= task.index <= MAX_STORED_INT
            and 0 <= group.round <= MAX_ROUND
            and len(question) <= max_chars
            and (answer is None or len(answer) <= max_chars)
            and 0 < len(completions) <= max_completions
            and max(map(len, completions)) <= max_chars
        ):
            return None
        rewards = _typed_rewards(group.rewards, len(completions))
        if rewards is None:
            return None
        proof = group.proof
        if proof is not None:
            proof = _typed_proof(proof, len(completions), max_chars)
            if proof is None:
                return None
            texts.append(proof.model)
        texts += completions
        texts += (task.dataset, question, answer or "")
        rollouts.append(
            RolloutIn(
                id=group.id,
                round=group.round,
                dataset=task.dataset,
                seed=task.seed,
                index=task.index,
                question=question,
                answer=answer,
                completions=tuple(completions),
                rewards=rewards,
                proof=proof,
            )
        )
    if not _clean("".join(texts)):
        return None
    if len({r.id for r in rollouts}) != len(rollouts):
        return None
    return Share(ref=ref, rollouts=tuple(rollouts))
