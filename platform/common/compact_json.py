"""Compact JSON text for values bound into SQL (jsonb columns written in one statement)."""

from __future__ import annotations

import json
from collections.abc import Sequence

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
