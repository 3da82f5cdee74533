"""binary_matrix, scored without eval.

reasoning-gym 0.1.25's `BinaryMatrixDataset.score_answer` gives 1.0 to the exact matrix text, and
0.1 to an answer that, passed to `eval()`, gives a matrix whose text is the expected one (a Python
list of lists). `eval` on node text runs the node's code on the server and on every node that samples
the group (`__import__('os').system(...)`), and `9**9**9` does not return.

Here the answer is read by a parser of Python's literal syntax, restricted to what can spell a
matrix: lists and tuples, integer literals (decimal, hexadecimal, octal, binary, with underscores and
unary signs), string literals without escapes (adjacent ones concatenated, as Python does),
parentheses around a value. Its value is rendered the way reasoning-gym renders `eval`'s result
(rows joined by newlines, each row's items by spaces). Anything else scores 0.0, where `eval` might
have found a matching matrix by computing one (`[[0]*3]*3`, `[[1-1, 1]]`); no honest answer needs
arithmetic to write down a matrix. tests/node/test_verifiers_parity.py compares the two on thousands
of answers.
"""

from __future__ import annotations

import re
from typing import Any

# Python's tokenizer's whitespace inside brackets: space, tab, form feed, newlines. Other Unicode
# spaces are a SyntaxError there, so they are here too.
_TOKEN = re.compile(
    r"""[ \t\f\r\n]*(?:
        (?P<int>(?:0[xX](?:_?[0-9a-fA-F])+|0[oO](?:_?[0-7])+|0[bB](?:_?[01])+|[1-9](?:_?[0-9])*|0(?:_?0)*)
                (?![0-9A-Za-z_.]))
      | (?P<str>'[^'\\\r\n]*'|"[^"\\\r\n]*")
      | (?P<punct>[\[\](),+-])
    )""",
    re.VERBOSE,
)
_TRAILING_SPACE = re.compile(r"[ \t\f\r\n]*")
# A matrix item's text is digits and a sign; an integer this large cannot be one of the expected
# distances, so its value is not needed (a literal of 1,000 hexadecimal digits costs no conversion).
_MAX_INT_CHARS = 32


class _NotALiteral(Exception):
    pass


class _Big:
    """An integer too large to be an expected item: it renders as something no matrix contains."""


def _tokens(text: str, limit: int) -> list[tuple[str, str]]:
    """The tokens of `text`; _NotALiteral past `limit` tokens or at anything else."""
    out = []
    pos, n = 0, len(text)
    while True:
        m = _TOKEN.match(text, pos)
        if m is None:
            if _TRAILING_SPACE.match(text, pos).end() == n:  # type: ignore[union-attr]
                return out
            raise _NotALiteral
        if len(out) == limit:
            raise _NotALiteral
        pos = m.end()
        kind = m.lastgroup
        out.append((kind, m.group(kind)))  # type: ignore[arg-type]


def _int(literal: str) -> int | _Big:
    digits = literal.replace("_", "")
    if digits.strip("0") == "":
        return 0  # "00" is a valid zero in Python, but not for int(..., 0)
    if len(digits) > _MAX_INT_CHARS:
        return _Big()
    return int(digits, 0)


class _Parser:
    """Recursive descent over the tokens. A matrix nests 3 deep (and a few parentheses around values
    are harmless); deeper cannot render as one, so the parser stops there and its recursion stays
    shallow."""

    MAX_DEPTH = 8

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _NotALiteral
        self.i += 1
        return tok

    def value(self, depth: int) -> Any:
        if depth > self.MAX_DEPTH:
            raise _NotALiteral
        negative = None  # None: no sign; else whether an odd number of "-" came first
        while self.peek() in (("punct", "+"), ("punct", "-")):
            negative = bool(negative) ^ (self.take()[1] == "-")
        kind, text = self.take()
        if kind == "int":
            value: Any = _int(text)
        elif kind == "str":
            parts = [text[1:-1]]
            while self.peek() is not None and self.peek()[0] == "str":  # type: ignore[index]
                parts.append(self.take()[1][1:-1])
            value = "".join(parts)
        elif text == "[":
            value = self.items("]", depth)
        elif text == "(":
            if self.peek() == ("punct", ")"):
                self.take()
                value = ()
            else:
                first = self.value(depth + 1)
                if self.peek() == ("punct", ")"):
                    self.take()
                    value = first  # parentheses around a value, not a tuple
                else:
                    self.expect(",")
                    value = (first, *self.items(")", depth, after_comma=True))
        else:
            raise _NotALiteral
        if negative is not None:
            if isinstance(value, _Big):
                return value
            if type(value) is not int:
                raise _NotALiteral  # a sign on a list or string: a TypeError for eval
            value = -value if negative else value
        return value

    def items(self, close: str, depth: int, after_comma: bool = False) -> list[Any]:
        """Comma-separated values up to `close` (a trailing comma allowed), the opening bracket taken."""
        out: list[Any] = []
        while True:
            if self.peek() == ("punct", close):
                self.take()
                return out
            if out and not after_comma:
                self.expect(",")
                if self.peek() == ("punct", close):
                    self.take()
                    return out
            out.append(self.value(depth + 1))
            after_comma = False

    def expect(self, punct: str) -> None:
        if self.take() != ("punct", punct):
            raise _NotALiteral


def _render(value: Any) -> str | None:
    """reasoning-gym's `_matrix_to_str` of `value`, or None where it raises or cannot match a matrix."""
    if not isinstance(value, (list, tuple, str)):
        return None  # iterating an int is a TypeError
    rows = []
    for row in value:
        if not isinstance(row, (list, tuple, str)):
            return None
        items = []
        for item in row:
            if isinstance(item, str):
                items.append(item)
            elif type(item) is int:
                items.append(str(item))
            else:
                return None  # a nested list or tuple, or a huge integer: brackets or too many digits
        rows.append(" ".join(items))
    return "\n".join(rows)


def score(answer: str, entry: dict[str, Any]) -> float:
    """reasoning-gym's `BinaryMatrixDataset.score_answer(answer, entry)` on literal answers."""
    expected = entry["answer"]
    if answer == expected:
        return 1.0
    # A matching literal has one integer or string per item or row of the expected matrix, a comma
    # after each, brackets around each row: a literal with several times more tokens (a sign or a
    # parenthesis on every item, at most) cannot match, so it is not read to the end.
    rows = expected.count("\n") + 1
    literals = expected.count(" ") + 2 * rows
    try:
        parser = _Parser(_tokens(answer, limit=4 * literals + 16))
        value = parser.value(1)
    except _NotALiteral:
        return 0.0
    if parser.peek() is not None:
        return 0.0  # more after the value: a SyntaxError for eval
    return 0.1 if _render(value) == expected else 0.0
