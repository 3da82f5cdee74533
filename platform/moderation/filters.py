"""The automatic content filters, as pure functions on text (no database): normalising and
fingerprinting completions for the duplicate rules, the length/character-class checks and the regex
blocklist with its safe-subset validation. moderation.screening runs them on incoming groups.

These say what each rule means; the per-item loops they need (normalising ASCII texts, simhashes,
character counts, the copy lookups) are moderation.kernels', in C or in numpy, with the same results
either way.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
import struct
import unicodedata
import uuid
from collections.abc import Sequence

import msgspec
import numpy as np

from moderation import kernels
from moderation.kernels import BAND_BUCKET, EXACT_BYTES, char_counts, exact_first, near_first
from moderation.rules import Rule

# --- normalising and fingerprints -----------------------------------------------------------------

SIMHASH_CHARS = 4000


def normalise(text: str) -> str:
    """What "the same text" means for copies: NFKC, case-folded, runs of whitespace as one space.

    ASCII text (nearly every completion) skips NFKC and casefold, which are the identity and `lower()`
    on ASCII; `str.split()` splits on exactly the characters `re`'s `\\s` matches."""
    folded = text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


def normalised_utf8(texts: Sequence[str]) -> list[bytes]:
    """`normalise(text).encode("utf-8")` of each text: the ASCII texts (nearly every completion) by
    kernels.normalised_ascii, the others one by one."""
    out = kernels.normalised_ascii(texts)
    return [normalise(t).encode("utf-8") if o is None else o for t, o in zip(texts, out, strict=True)]


def question_hashes(questions: Sequence[str]) -> list[str]:
    """The key of each question's fingerprints: the SHA-1 of its normalised text (normalised together,
    `normalised_utf8`)."""
    return [hashlib.sha1(q).hexdigest() for q in normalised_utf8(questions)]  # noqa: S324 - a key, not a secret


def simhashes(normalised: Sequence[str]) -> list[int]:
    """The 64-bit simhash of each text's byte 4-grams (first SIMHASH_CHARS characters), as a signed int
    (fits PostgreSQL bigint and JSON). Near-identical texts differ in few bits.

    Every gram of a text gets a 64-bit hash (FNV-style over its 4 bytes, then murmur3's finaliser, which
    spreads every input bit over all 64 output bits); bit b of the simhash is set when more than half the
    grams have it set. A text shorter than 4 bytes is padded with zero bytes. All the texts are hashed
    in one call (kernels.simhashes).
    """
    return kernels.simhashes([t[:SIMHASH_CHARS].encode("utf-8") for t in normalised]).tolist()


def simhash(normalised: str) -> int:
    """The simhash of one text (see `simhashes`)."""
    return simhashes([normalised])[0]


class Fingerprint(msgspec.Struct, frozen=True):
    """A group's fingerprints (a msgspec Struct: one is built per group of every share, faster than a
    frozen dataclass)."""

    exact: list[bytes]  # 16-byte BLAKE2b digest of each normalised completion
    simhash: list[int]
    lengths: list[int]  # normalised length of each completion
    #: Each completion's normalised text, UTF-8 (what `exact` digests): measured (`distinct_grams`) only
    #: when a completion matches another node's.
    normalised: list[bytes]
    #: The simhashes as 8-byte big-endian signed integers, concatenated (`simhash_bytes`), as
    #: RolloutFingerprint.simhash stores them (PostgreSQL's int8send writes the same bytes).
    simhash_packed: bytes

    def exact_bytes(self) -> bytes:
        """The digests concatenated, as RolloutFingerprint.exact stores them."""
        return b"".join(self.exact)


def simhash_bytes(hashes: Sequence[int]) -> bytes:
    """Signed 64-bit simhashes as RolloutFingerprint.simhash stores them: 8 bytes each, big-endian."""
    return struct.pack(f">{len(hashes)}q", *hashes)


def fingerprints(groups: Sequence[Sequence[str]]) -> list[Fingerprint]:
    """The fingerprints of several groups' completions (one per group, in order), the simhashes of all
    of them computed in one pass: a share's groups cost one numpy call, not one per completion."""
    encoded = normalised_utf8([c for completions in groups for c in completions])
    exact = [hashlib.blake2b(e, digest_size=EXACT_BYTES).digest() for e in encoded]
    # A text's length in characters: its bytes' length unless it is not ASCII (rare: decoded again).
    lengths = [len(e) if e.isascii() else len(e.decode("utf-8")) for e in encoded]
    array = kernels.simhashes([_simhashed(e, n) for e, n in zip(encoded, lengths, strict=True)])
    hashes = array.tolist()
    packed = simhash_bytes(hashes)  # once for the share, not per group
    out = []
    at = 0
    for completions in groups:
        end = at + len(completions)
        out.append(
            Fingerprint(
                exact=exact[at:end],
                simhash=hashes[at:end],
                lengths=lengths[at:end],
                normalised=encoded[at:end],
                simhash_packed=packed[8 * at : 8 * end],
            )
        )
        at = end
    return out


def _simhashed(encoded: bytes, length: int) -> bytes:
    """What the simhash of a normalised text (UTF-8, `length` characters) reads: its first SIMHASH_CHARS
    characters."""
    if length <= SIMHASH_CHARS or len(encoded) <= SIMHASH_CHARS:
        return encoded
    return encoded.decode("utf-8")[:SIMHASH_CHARS].encode("utf-8")


def distinct_grams(texts: Sequence[bytes]) -> list[int]:
    """How many distinct byte 4-grams (the simhash's grams, kernels.SHINGLE bytes) each text holds: its
    information once repeats are collapsed. `<answer>no</answer>no</answer>...` holds 12 however long
    it runs; a varied text of n bytes nearly n."""
    return gram_profile(texts)[0]


def gram_profile(texts: Sequence[bytes]) -> tuple[list[int], list[int]]:
    """Per text, how many distinct byte 4-grams it holds (`distinct_grams`) and how many times its most
    frequent one occurs. One numpy pass over all the texts: each gram as a big-endian uint32 beside its
    text's number, the distinct pairs counted per text."""
    if not texts:
        return [], []
    width = kernels.SHINGLE
    data = np.frombuffer(b"".join(texts), dtype=np.uint8).astype(np.uint64)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    starts = np.cumsum(lengths) - lengths
    grams = np.maximum(lengths - width + 1, 0)  # (m,) windows of each text
    if not grams.any():
        return [0] * len(texts), [0] * len(texts)
    owner = np.repeat(np.arange(len(texts), dtype=np.uint64), grams)  # (g,) each window's text
    at = np.repeat(starts - np.cumsum(grams) + grams, grams) + np.arange(int(grams.sum()))  # (g,) window starts
    value = np.zeros(at.size, dtype=np.uint64)
    for k in range(width):
        value = (value << np.uint64(8)) | data[at + k]
    keys, counts = np.unique((owner << np.uint64(32)) | value, return_counts=True)  # (d,) sorted by text
    owners = (keys >> np.uint64(32)).astype(np.int64)
    top = np.zeros(len(texts), dtype=np.int64)
    np.maximum.at(top, owners, counts)
    return np.bincount(owners, minlength=len(texts)).tolist(), top.tolist()


#: Bytes of a question key: the SHA-1 of the normalised question (`question_hashes`, as raw bytes).
QUESTION_BYTES = 20


def question_keys(hashes: Sequence[str]) -> bytes:
    """The question keys of question hashes (`question_hashes`' hex digests), concatenated."""
    return b"".join(bytes.fromhex(h) for h in hashes)


def _keys(questions: bytes) -> np.ndarray:
    return np.frombuffer(questions, dtype=np.uint8).reshape(-1, QUESTION_BYTES)


def _keyed_digests(exact: bytes, keys: np.ndarray) -> bytes:
    """Digests (concatenated) XORed with the first EXACT_BYTES bytes of their question's key ((n, 20)
    uint8, a row per digest). With `_keyed_hashes`: two fingerprints on one question compare as before
    (equal digests stay equal, simhashes XOR one mask keep their distances); on two questions, a digest
    or a simhash meets the other's only by chance (a simhash within distance 3 of another's: ~1e-12),
    so a share's lookups, one call for all its groups, find copies on each group's own question only."""
    if not len(keys):
        return exact
    return (np.frombuffer(exact, dtype=np.uint8).reshape(-1, EXACT_BYTES) ^ keys[:, :EXACT_BYTES]).tobytes()


def _keyed_hashes(hashes: bytes, keys: np.ndarray) -> bytes:
    """Simhashes (8 bytes each, big-endian) XORed with the last 8 bytes of their question's key."""
    if not len(keys):
        return hashes
    masks = np.ascontiguousarray(keys[:, QUESTION_BYTES - 8 :]).view(">u8").reshape(-1)
    return (np.frombuffer(hashes, dtype=">u8") ^ masks).astype(">u8").tobytes()


class CopyIndex:
    """The completions of other nodes' recent groups, for exact and near lookups, held as the bytes the
    database returns (RolloutFingerprint's columns concatenated): no Python object per
    candidate completion. A share's candidates reach 50 groups per question, ~13,000 completions for a
    share of 32 questions: decoding them as JSON and indexing them one by one would cost more than the
    rest of the share (docs/benchmarks.md, "How ingest is made fast").

    Exact: a completion copies a candidate with the same digest (the first group holding it, in the
    order added). Near: a completion copies the first candidate within the rule's distance among, per
    band value it shares, the first BAND_BUCKET candidates in the order added, bands in order. The
    lookups are moderation.kernels' (exact_first, near_first).
    """

    def __init__(
        self,
        ids: bytes = b"",
        counts: Sequence[int] = (),
        exact: bytes = b"",
        hashes: bytes = b"",
        questions: bytes | None = None,
    ) -> None:
        """The groups as the screening query returns them, in order (none by default): `ids` their UUIDs
        (16 bytes each), `counts` their completions, `exact` and `hashes` their fingerprints
        concatenated (RolloutFingerprint's columns); `questions` their question keys (QUESTION_BYTES
        each: `question_keys`), when a lookup is to find only the groups on the probe's own question
        (`copy_findings`' `questions`), None when every group is a candidate for every probe. Raises
        ValueError when the sizes disagree."""
        total = sum(counts)
        if len(ids) != 16 * len(counts) or len(exact) != EXACT_BYTES * total or len(hashes) != 8 * total:
            raise ValueError("fingerprint buffers of inconsistent sizes")
        if questions is not None:
            if len(questions) != QUESTION_BYTES * len(counts):
                raise ValueError("fingerprint buffers of inconsistent sizes")
            keys = np.repeat(_keys(questions), counts, axis=0)
            exact, hashes = _keyed_digests(exact, keys), _keyed_hashes(hashes, keys)
        self._ids, self._counts, self._exact, self._hashes = ids, tuple(counts), exact, hashes
        self.keyed = questions is not None
        self._ends: list[int] | None = None  # each group's end among the completions, once a match needs it

    def after(
        self, groups: Sequence[tuple[uuid.UUID, Fingerprint]], questions: Sequence[str] | None = None
    ) -> CopyIndex:
        """A new index holding `groups` (id and fingerprint, in order) first, then this one's; a keyed
        index (`keyed`) needs their question hashes, `questions`."""
        if not groups:
            return self
        if self.keyed and (questions is None or len(questions) != len(groups)):
            raise ValueError("an index keyed by question needs each group's question")
        ahead = CopyIndex(
            b"".join(rid.bytes for rid, _ in groups),
            [len(fp.exact) for _, fp in groups],
            b"".join(fp.exact_bytes() for _, fp in groups),
            b"".join(fp.simhash_packed for _, fp in groups),
            question_keys(questions) if self.keyed else None,
        )
        joined = CopyIndex()
        joined._ids, joined._counts = ahead._ids + self._ids, ahead._counts + self._counts
        joined._exact, joined._hashes, joined.keyed = (
            ahead._exact + self._exact,
            ahead._hashes + self._hashes,
            self.keyed,
        )
        return joined

    def _id(self, k: int) -> str:
        return str(uuid.UUID(bytes=self._ids[16 * k : 16 * (k + 1)]))

    def _group_id(self, c: int) -> str:
        """The id of the group holding candidate completion `c`."""
        if self._ends is None:
            self._ends = list(itertools.accumulate(self._counts))
        return self._id(bisect.bisect_right(self._ends, c))

    def exact_matches(self, digests: Sequence[bytes]) -> list[str | None]:
        """For each digest, the first group (in the order added) holding a completion with it, or None."""
        found: list[str | None] = [None] * len(digests)
        exact = self._exact
        if not digests or not exact:
            return found
        return [None if c < 0 else self._group_id(c) for c in exact_first(exact, digests)]

    def near_matches(self, hashes: Sequence[int], max_distance: int) -> list[str | None]:
        """For each simhash, the first candidate group within `max_distance` bits (bands in order, then
        candidates in the order added, at most BAND_BUCKET per band value), or None.

        Every (hash, band, candidate sharing the band value) pair is checked in that order, and each hash
        keeps its first pair within the distance (kernels.near_first, BANDS bands of 16 bits)."""
        found: list[str | None] = [None] * len(hashes)
        if not hashes or not self._hashes:
            return found
        hits = near_first(self._hashes, hashes, max_distance, BAND_BUCKET)
        return [None if c < 0 else self._group_id(c) for c in hits]


def copy_findings(
    fps: Sequence[Fingerprint],
    index: CopyIndex,
    rule: Rule,
    *,
    near: bool,
    questions: Sequence[str] | None = None,
) -> list[tuple[str, list[str]] | None]:
    """Per group: (detail, [source rollout ids]) when at least `min_share` of its completions that count
    copy another node's; None otherwise (or when none counts). A completion counts when it has at least
    `min_chars` normalised characters and at least `min_distinct_grams` distinct 4-grams (in what its
    fingerprint reads: the whole text for the exact rule, the simhash's first SIMHASH_CHARS characters
    for the near one, which also needs at least `min_distinct_share` of its grams distinct and its most
    frequent gram at most `max_top_gram_share` of them): a text
    that says so little, `<answer>no</answer>no</answer>...` up to a token
    limit, is written the same by nodes that never saw each other's, so its coinciding is no evidence
    of copying. The near lookups of all the groups are one vectorised call; the grams are counted only
    in a group where a completion matched (nearly no share has one), where they decide what counts.

    `questions`: each group's question hash, for an index keyed by question (CopyIndex's `questions`):
    a completion is then compared with the candidates on its own group's question only."""
    min_chars = rule["min_chars"]
    probes: list = []
    chosen: list[list[int]] = []  # per group, its completions long enough (looked up, in order)
    for fp in fps:
        values = fp.simhash if near else fp.exact
        if min(fp.lengths, default=min_chars) >= min_chars:  # all of them (honest groups nearly always)
            probes += values
            chosen.append(list(range(len(values))))
        else:
            kept = [i for i, n in enumerate(fp.lengths) if n >= min_chars]
            probes += [values[i] for i in kept]
            chosen.append(kept)
    if index.keyed:
        if questions is None:
            raise ValueError("an index keyed by question needs each group's question")
        keys = np.repeat(_keys(question_keys(questions)), [len(kept) for kept in chosen], axis=0)
        if near:
            signed = np.asarray(probes, dtype=np.int64).astype(">i8").tobytes()
            probes = np.frombuffer(_keyed_hashes(signed, keys), dtype=">i8").tolist()
        else:
            joined = _keyed_digests(b"".join(probes), keys)
            probes = [joined[k : k + EXACT_BYTES] for k in range(0, len(joined), EXACT_BYTES)]
    flat = index.near_matches(probes, rule["max_distance"]) if near else index.exact_matches(probes)
    if not any(flat):  # no completion copies anything (nearly every share)
        return [None] * len(fps)
    findings: list[tuple[str, list[str]] | None] = []
    at = 0
    for fp, kept in zip(fps, chosen, strict=True):
        matches = flat[at : at + len(kept)]
        at += len(kept)
        if not any(matches):
            findings.append(None)
            continue
        texts = [fp.normalised[i] for i in kept]
        if near:
            texts = [_simhashed(t, fp.lengths[i]) for t, i in zip(texts, kept, strict=True)]
        least = rule["min_distinct_grams"]
        if near:  # a simhash is its grams' majority vote: a text mostly of repeats votes its repeats
            share, heaviest = rule["min_distinct_share"], rule["max_top_gram_share"]
            # ... and so does one gram that outweighs the rest of the vote (`++++` in a text of varied junk)
            windows = [len(t) - kernels.SHINGLE + 1 for t in texts]
            counts = [
                n >= least and n >= share * w and top <= heaviest * w
                for n, top, w in zip(*gram_profile(texts), windows, strict=True)
            ]
        else:
            counts = [n >= least for n in distinct_grams(texts)]
        sources = [m for m, counted in zip(matches, counts, strict=True) if counted and m is not None]
        count = sum(counts)
        if not sources or len(sources) / count < rule["min_share"]:
            findings.append(None)
            continue
        kind = "near copies" if near else "exact copies"
        detail = f"{len(sources)} of {count} completions are {kind} of other nodes' groups"
        findings.append((detail, sorted(set(sources))))
    return findings


# --- length and character classes -----------------------------------------------------------------


def length_findings(groups: Sequence[Sequence[str]], rule: Rule) -> list[str | None]:
    """Per group: its first completion longer than the length rule's limit, described; None if none is."""
    limit = rule["max_chars"]
    findings: list[str | None] = []
    for completions in groups:
        over = next((i for i, text in enumerate(completions) if len(text) > limit), None)
        findings.append(
            None if over is None else f"completion {over + 1} has {len(completions[over])} characters (limit {limit})"
        )
    return findings


def character_findings(groups: Sequence[Sequence[str]], rule: Rule) -> list[str | None]:
    """Per group: its first completion over a character-class share of the characters rule, described;
    None if all pass. The character counts of all groups' completions are computed and compared in
    one pass; only a group with a completion over a limit is looked at completion by completion."""
    floor = max(1, rule["min_chars_for_shares"])
    texts = [t for completions in groups for t in completions]
    lengths, *counts = char_counts(texts)
    limits = (rule["max_nonprintable_share"], rule["max_non_ascii_share"], rule["max_repeat_share"])
    over = np.zeros(len(texts), dtype=bool)
    shares_apply = lengths >= floor
    for count, limit in zip(counts, limits, strict=True):
        # int64 / int64 in float64 is the same correctly rounded quotient as Python's int / int
        over |= shares_apply & (count / np.maximum(lengths, 1) > limit)
    over_at = over.tolist()
    findings: list[str | None] = []
    at = 0
    for completions in groups:
        findings.append(None)
        if any(over_at[at : at + len(completions)]):
            findings[-1] = _first_over(completions, [c[at : at + len(completions)].tolist() for c in counts], rule)
        at += len(completions)
    return findings


def _first_over(completions: Sequence[str], counts: list[list[int]], rule: Rule) -> str | None:
    floor = max(1, rule["min_chars_for_shares"])
    for i, text in enumerate(completions):
        n = len(text)
        if n < floor:
            continue
        for label, count, limit in (
            ("non-printable", counts[0][i], rule["max_nonprintable_share"]),
            ("non-ASCII", counts[1][i], rule["max_non_ascii_share"]),
            ("repeated", counts[2][i], rule["max_repeat_share"]),
        ):
            if count / n > limit:
                return f"completion {i + 1}: {count / n:.0%} {label} characters (limit {limit:.0%})"
    return None


# --- the regex blocklist (patterns validated by moderation.safe_regex when a moderator saves them) ---

#: Only this much of each text is matched: with the safe subset below matching is linear in practice,
#: and the cap bounds it regardless.
MAX_SCAN_CHARS = 20_000


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
