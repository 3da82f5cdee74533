"""Names people choose for others to read (display names, team names) and the hosts of the addresses
they link to: look-alikes, invisible characters and the reserved name (docs/community.md#names).

Two names are the same name when their confusable skeletons are equal: Unicode's UTS #39 skeleton
(ICU's SpoofChecker, the reference implementation) of the NFKC text, case-folded before or after, so
"Аlpha Team" (Cyrillic А), "ALPHA TEAM", "AIpha Team" and "A1pha Team" are one name. A name may not mix scripts the way a
look-alike does (ICU's "moderately restrictive" level: Latin with Cyrillic or Greek is refused, Latin
with Han, Kana or Hangul is allowed), may not contain invisible characters (default-ignorable code
points such as zero-width spaces, bidirectional overrides and the Hangul fillers U+3164, U+115F,
U+1160, U+FFA0; control, format, private-use and unassigned code points), and must show at least one
letter or digit. The callers reserve "anonymous" (accounts.models.ANONYMOUS, the name private
contributors are shown under) in every spelling that looks like it (`looks_like`).
"""

from __future__ import annotations

import unicodedata

import icu
from django.db.models import Q

# ICU's checker is thread-safe for checks once configured (it is never changed after this).
_CHECKER = icu.SpoofChecker()
_CHECKER.setChecks(icu.USpoofChecks.RESTRICTION_LEVEL | icu.USpoofChecks.INVISIBLE | icu.USpoofChecks.MIXED_NUMBERS)
_CHECKER.setRestrictionLevel(icu.URestrictionLevel.MODERATELY_RESTRICTIVE)
_INVISIBLE = icu.UnicodeSet(
    "[[:Default_Ignorable_Code_Point:][:Cc:][:Cf:][:Cs:][:Co:][:Cn:][:Zl:][:Zp:]\u2800]"  # U+2800: a blank braille cell
)
_ANY_SPACE_BUT_SPACE = frozenset(ch for ch in map(chr, range(0x3100)) if ch.isspace() and ch != " ") | {"\u3000"}


def _keys(text: str) -> tuple[str, str]:
    nfkc = unicodedata.normalize("NFKC", text)
    # Two keys: case-folding first makes "ALICE" read as "alice", but loses that a capital I reads as
    # an l ("AIice"); the skeleton first keeps that, but would tell "ALICE" from "alice".
    return _CHECKER.getSkeleton(0, nfkc.casefold()).casefold(), _CHECKER.getSkeleton(0, nfkc).casefold()


def skeleton(text: str) -> str:
    """The text's confusable skeleton keys, as stored beside a name (`skeleton_filter` matches them)."""
    return "\n".join(_keys(text))  # no name contains a line break


def skeleton_filter(field: str, text: str) -> Q:
    """Rows whose `field` (a stored `skeleton`) reads as `text` (case and look-alike letters aside)."""
    case_folded, as_written = _keys(text)
    return Q(**{f"{field}__startswith": case_folded + "\n"}) | Q(**{f"{field}__endswith": "\n" + as_written})


def name_problem(text: str) -> str | None:
    """Why `text` (whitespace already collapsed to single spaces) may not be a name, as the end of a
    sentence ("contains invisible characters"), or None."""
    if _INVISIBLE.containsSome(text) or any(ch in _ANY_SPACE_BUT_SPACE for ch in text):
        return "contains invisible or control characters"
    if not any(unicodedata.category(ch)[0] in "LN" for ch in text):
        return "shows no letter or digit"
    flags = _CHECKER.check(text)
    if flags & icu.USpoofChecks.MIXED_NUMBERS:
        return "mixes digits of different scripts"
    if flags & (icu.USpoofChecks.RESTRICTION_LEVEL | icu.USpoofChecks.INVISIBLE):
        return "mixes scripts the way look-alike names do (e.g. Latin with Cyrillic or Greek)"
    return None


def looks_like(text: str, other: str) -> bool:
    """Whether the two read as the same name (in any case, with look-alike letters)."""
    return any(a == b for a, b in zip(_keys(text), _keys(other), strict=True))


def host_problem(host: str) -> str | None:
    """Why an address's host (as the URL spells it, Unicode or punycode) may not be linked to, or None:
    a label that mixes scripts, or one in another script whose skeleton is plain ASCII (it imitates an
    ASCII name: "аpple", "раураl")."""
    try:
        unicode_host = host.encode("ascii").decode("idna") if "xn--" in host.lower() else host
    except UnicodeError:
        return "is not a valid international host name"
    for label in unicode_host.split("."):
        if label.isascii():
            continue
        if _INVISIBLE.containsSome(label) or _CHECKER.check(label):
            return "mixes scripts or hides characters"
        if skeleton(label).isascii():
            return "imitates an ASCII host name"
    return None
