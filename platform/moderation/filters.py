"""The automatic content filters, as pure functions on text (no database): normalising and
fingerprinting completions for the duplicate rules, the length/character-class checks and the regex
blocklist with its safe-subset validation. moderation.screening runs them on incoming groups.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moderation.rules import Rule

# --- normalising and fingerprints -----------------------------------------------------------------

_WS_RE = re.compile(r"\s+")
SHINGLE = 4
SIMHASH_CHARS = 4000
_MASK64 = (1 << 64) - 1


def normalise(text: str) -> str:
    """What "the same text" means for copies: NFKC, case-folded, runs of whitespace as one space."""
    return _WS_RE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_hash(normalised: str) -> str:
    return hashlib.blake2b(normalised.encode("utf-8"), digest_size=16).hexdigest()


def question_hash(question: str) -> str:
    return hashlib.sha1(normalise(question).encode("utf-8")).hexdigest()  # noqa: S324 - a key, not a secret


_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFTS = np.arange(64, dtype=np.uint64)


def _gram_hashes(data: bytes) -> np.ndarray:
    """A 64-bit hash of every SHINGLE-byte window of `data` (vectorised; uint64 arithmetic wraps)."""
    raw = np.frombuffer(data, dtype=np.uint8).astype(np.uint64)
    if raw.size < SHINGLE:
        raw = np.concatenate([raw, np.zeros(SHINGLE - raw.size, dtype=np.uint64)])
    n = raw.size - SHINGLE + 1
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(SHINGLE):
            h = h * np.uint64(1099511628211) + raw[k : k + n] + np.uint64(1)
        # murmur3's finaliser: spreads every input bit over all 64 output bits
        h ^= h >> np.uint64(33)
        h *= _MIX1
        h ^= h >> np.uint64(33)
        h *= _MIX2
        h ^= h >> np.uint64(33)
    return h


def simhash(normalised: str) -> int:
    """64-bit simhash of the text's byte 4-grams (first SIMHASH_CHARS characters), as a signed int
    (fits PostgreSQL bigint and JSON). Near-identical texts differ in few bits."""
    hashes = _gram_hashes(normalised[:SIMHASH_CHARS].encode("utf-8"))
    ones = ((hashes[:, None] >> _SHIFTS) & np.uint64(1)).sum(axis=0, dtype=np.int64)
    value = sum(1 << bit for bit in range(64) if 2 * int(ones[bit]) > hashes.size)
    return value - (1 << 64) if value >= 1 << 63 else value


def hamming(a: int, b: int) -> int:
    return ((a ^ b) & _MASK64).bit_count()


def bands(value: int) -> list[tuple[int, int]]:
    """The simhash cut in 4 bands of 16 bits. Two hashes within Hamming distance 3 share at least one
    band exactly (pigeonhole), so near copies are found by 4 dictionary lookups, not by all pairs."""
    value &= _MASK64
    return [(i, (value >> (16 * i)) & 0xFFFF) for i in range(4)]


@dataclass(frozen=True)
class Fingerprint:
    exact: list[str]
    simhash: list[int]
    lengths: list[int]  # normalised length of each completion


def fingerprint(completions: Sequence[str]) -> Fingerprint:
    normalised = [normalise(c) for c in completions]
    return Fingerprint(
        exact=[text_hash(n) for n in normalised],
        simhash=[simhash(n) for n in normalised],
        lengths=[len(n) for n in normalised],
    )


class CopyIndex:
    """The completions of other nodes' recent groups, indexed for exact and near lookups."""

    def __init__(self) -> None:
        self.exact: dict[str, str] = {}  # text hash -> rollout id
        self.band: dict[tuple[int, int], list[tuple[int, str]]] = {}  # band -> [(simhash, rollout id)]

    def add(self, rollout_id: str, exact: Sequence[str], hashes: Sequence[int]) -> None:
        for h in exact:
            self.exact.setdefault(h, rollout_id)
        for s in hashes:
            for b in bands(s):
                bucket = self.band.setdefault(b, [])
                if len(bucket) < 64:  # a degenerate band (very common text) stays bounded
                    bucket.append((s, rollout_id))

    def exact_match(self, h: str) -> str | None:
        return self.exact.get(h)

    def near_match(self, s: int, max_distance: int) -> str | None:
        for b in bands(s):
            for other, rollout_id in self.band.get(b, ()):
                if hamming(s, other) <= max_distance:
                    return rollout_id
        return None


def copy_finding(fp: Fingerprint, index: CopyIndex, rule: Rule, *, near: bool) -> tuple[str, list[str]] | None:
    """(detail, [source rollout ids]) when at least `min_share` of the group's completions of at least
    `min_chars` normalised characters copy another node's; None otherwise (or when none are long)."""
    long_enough = [i for i, n in enumerate(fp.lengths) if n >= rule["min_chars"]]
    if not long_enough:
        return None
    sources: list[str] = []
    for i in long_enough:
        if near:
            source = index.near_match(fp.simhash[i], rule["max_distance"])
        else:
            source = index.exact_match(fp.exact[i])
        if source is not None:
            sources.append(source)
    share = len(sources) / len(long_enough)
    if not sources or share < rule["min_share"]:
        return None
    kind = "near copies" if near else "exact copies"
    detail = f"{len(sources)} of {len(long_enough)} completions are {kind} of other nodes' groups"
    return detail, sorted(set(sources))


# --- length and character classes -----------------------------------------------------------------


_NONPRINTABLE_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]")


def _shares(text: str) -> tuple[float, float, float]:
    """Shares of non-printable (controls other than tab/newline, zero-width and bidi marks), non-ASCII
    and repeated (equal to the previous) characters. Vectorised: C loops only."""
    n = len(text)
    nonprintable = len(_NONPRINTABLE_RE.findall(text))
    non_ascii = n - len(text.encode("ascii", "ignore"))
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    repeats = int((codes[1:] == codes[:-1]).sum())
    return nonprintable / n, non_ascii / n, repeats / n


def length_finding(completions: Sequence[str], rule: Rule) -> str | None:
    """The first completion breaking a length or character-class limit, described; None if all pass."""
    for i, text in enumerate(completions):
        if len(text) > rule["max_chars"]:
            return f"completion {i + 1} has {len(text)} characters (limit {rule['max_chars']})"
        if len(text) < max(1, rule["min_chars_for_shares"]):
            continue
        nonprintable, non_ascii, repeats = _shares(text)
        for label, value, limit in (
            ("non-printable", nonprintable, rule["max_nonprintable_share"]),
            ("non-ASCII", non_ascii, rule["max_non_ascii_share"]),
            ("repeated", repeats, rule["max_repeat_share"]),
        ):
            if value > limit:
                return f"completion {i + 1}: {value:.0%} {label} characters (limit {limit:.0%})"
    return None


# --- the regex blocklist --------------------------------------------------------------------------

MAX_PATTERNS = 100
MAX_PATTERN_LENGTH = 200
#: Only this much of each text is matched: with the safe subset below matching is linear in practice,
#: and the cap bounds it regardless.
MAX_SCAN_CHARS = 20_000


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


_compiled: dict[tuple[str, ...], list[re.Pattern[str]]] = {}


def _compile(patterns: Sequence[str]) -> list[re.Pattern[str]]:
    key = tuple(patterns)
    compiled = _compiled.get(key)
    if compiled is None:
        if len(_compiled) > 32:
            _compiled.clear()
        compiled = _compiled[key] = [re.compile(p, re.IGNORECASE) for p in patterns]
    return compiled


def blocklist_finding(texts: Sequence[str], rule: Rule) -> str | None:
    """The first blocklisted pattern found in any of the texts (question, answer, completions)."""
    for pattern in _compile(rule["patterns"]):
        for text in texts:
            if text and pattern.search(text[:MAX_SCAN_CHARS]):
                return f"matches blocklisted pattern {pattern.pattern!r}"
    return None
