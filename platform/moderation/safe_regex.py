"""The safe subset of regular expressions for the blocklist rule: what a moderator may save.

Python's `re` backtracks; a pattern such as (a+)+ takes exponential time on a crafted completion. The
blocklist runs on untrusted text at ingest, so only patterns without the constructs behind
catastrophic backtracking are accepted. Pure functions; no Django, no other moderation module.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 200


class BlocklistError(ValueError):
    pass


try:  # Python 3.11+
    from re import _constants as _sre_constants  # type: ignore[attr-defined]
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

_REPEATS = {_sre_constants.MAX_REPEAT, _sre_constants.MIN_REPEAT, getattr(_sre_constants, "POSSESSIVE_REPEAT", None)}
_FORBIDDEN = {
    _sre_constants.GROUPREF: "back-references",
    _sre_constants.GROUPREF_EXISTS: "conditional groups",
    _sre_constants.ASSERT: "look-arounds",
    _sre_constants.ASSERT_NOT: "look-arounds",
}


def _check_tree(tree, inside_repeat: bool) -> None:  # noqa: ANN001 - sre_parse internals
    for op, arg in tree:
        if op in _FORBIDDEN:
            raise BlocklistError(f"{_FORBIDDEN[op]} are not allowed")
        if op in _REPEATS:
            low, high, sub = arg
            unbounded = high == _sre_constants.MAXREPEAT or high > 100
            if inside_repeat and (unbounded or high > 1):
                raise BlocklistError("nested repetition such as (a+)+ is not allowed")
            _check_tree(sub, inside_repeat or unbounded)
        elif op == _sre_constants.SUBPATTERN:
            _check_tree(arg[-1], inside_repeat)
        elif op == _sre_constants.BRANCH:
            if inside_repeat:
                raise BlocklistError("alternation inside a repetition such as (a|ab)* is not allowed")
            for branch in arg[1]:
                _check_tree(branch, inside_repeat)
        elif op == getattr(_sre_constants, "ATOMIC_GROUP", None):
            _check_tree(arg, inside_repeat)


def validate_pattern(pattern: str) -> str:
    """A pattern of the safe subset, or BlocklistError: at most MAX_PATTERN_LENGTH characters, compiles,
    no back-references / look-arounds / conditionals, no repetition nested in an unbounded repetition and
    no alternation inside one -- the constructs behind catastrophic backtracking in `re`."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise BlocklistError("empty pattern")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise BlocklistError(f"a pattern has at most {MAX_PATTERN_LENGTH} characters")
    try:
        tree = _sre_parse.parse(pattern, re.IGNORECASE)
    except re.error as exc:
        raise BlocklistError(f"{pattern!r}: {exc}") from exc
    try:
        _check_tree(tree, inside_repeat=False)
    except BlocklistError as exc:
        raise BlocklistError(f"{pattern!r}: {exc}") from exc
    return pattern


def validate_patterns(patterns: Sequence[str]) -> list[str]:
    cleaned = [p.strip() for p in patterns if p.strip()]
    if len(cleaned) > MAX_PATTERNS:
        raise BlocklistError(f"at most {MAX_PATTERNS} patterns")
    return [validate_pattern(p) for p in cleaned]
