"""Compact JSON text: for values bound into SQL (jsonb columns written in one statement), and for the
node socket's replies, whose members may already be JSON (`Raw`, `RawList`, `dumps_object`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: No spaces, non-ASCII kept as is (a completion in another script costs its UTF-8 bytes, not \u escapes).
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

#: What JSON escapes in a string: the controls below 0x20, the quote and the backslash.
_ESCAPED = bytes(range(0x20)) + b'"\\'


def dumps_texts(texts: Sequence[str]) -> str:
    """`dumps(list(texts))`. A list of ASCII texts with nothing to escape is quoted and joined as it is:
    the encoder's pass over every character (most of a share's JSON cost) is needed only otherwise."""
    plain = "".join(texts)
    if texts and plain.isascii():
        data = plain.encode("ascii")
        if len(data.translate(None, _ESCAPED)) == len(data):
            return '["' + '","'.join(texts) + '"]'
    return dumps(list(texts))


def dumps_floats(values: Sequence[float]) -> str:
    """`dumps(list(values))` of floats (a group's rewards), joined from their reprs, as the encoder writes
    a finite float, in a third less time; a list with NaN or an infinity (whose reprs hold an "n"), or
    with something not a float, is left to the encoder."""
    try:
        text = "[" + ",".join(map(float.__repr__, values)) + "]"
    except TypeError:
        return dumps(list(values))
    return text if "n" not in text else dumps(list(values))


class Raw:
    """A member's value that is JSON text already (a jsonb column as PostgreSQL wrote it, a catalogue
    encoded once per process), written as it is by `dumps_object`. Not a str: anywhere else the encoder
    refuses it (TypeError) instead of quoting it as a string."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class RawList:
    """A member's value that is a list whose items are JSON text already (a `samples` reply's groups,
    each written once by pool.payloads), written by `dumps_object` as the list of those texts in order.
    Like Raw, refused anywhere else (TypeError)."""

    __slots__ = ("texts",)

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = texts


#: Replies escape non-ASCII: a reply may echo a node's text, and a JSON escape such as "\ud800" in what
#: a node sent decodes to a lone surrogate, which a UTF-8 text frame cannot carry.
_dumps_ascii = json.JSONEncoder(separators=(",", ":")).encode


def dumps_object(members: Mapping[str, Any]) -> str:
    """`members` as one JSON object, in their order, ASCII only, where a `Raw` value is written as its
    text and a `RawList` as the list of its texts: what `json.dumps` would write for the object with
    each parsed in its place. Runs of the other members are encoded together, so an object without
    either costs one encoder call."""
    parts: list[str] = []
    run: dict[str, Any] = {}
    for key, value in members.items():
        kind = type(value)
        if kind is Raw or kind is RawList:
            if run:
                parts.append(_dumps_ascii(run)[1:-1])
                run = {}
            text = value.text if kind is Raw else "[" + ",".join(value.texts) + "]"
            parts.append(f"{_dumps_ascii(key)}:{text}")
        else:
            run[key] = value
    if not parts:
        return _dumps_ascii(run)
    if run:
        parts.append(_dumps_ascii(run)[1:-1])
    return "{" + ",".join(parts) + "}"
