"""The automatic content filters, as pure functions on text (no database): normalising and
fingerprinting completions for the duplicate rules, the length/character-class checks and the regex
blocklist with its safe-subset validation. moderation.screening runs them on incoming groups.

The per-completion work (normalising ASCII texts, simhashes, character counts) runs in C when the
`sapo_native` extension is installed (native/, built by `make venv` and the Docker image) and
SAPO_NATIVE is not off (common.native), in the numpy twins below otherwise: the same results bit for bit
(tests/platform/test_native.py), at more CPU (docs/benchmarks.md, "Ingest").
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import re
import struct
import threading
import unicodedata
import uuid
from collections.abc import Sequence

import msgspec
import numpy as np

from common.native import native
from moderation.rules import Rule

# --- normalising and fingerprints -----------------------------------------------------------------

SHINGLE = 4
SIMHASH_CHARS = 4000
_MASK64 = (1 << 64) - 1


def normalise(text: str) -> str:
    """What "the same text" means for copies: NFKC, case-folded, runs of whitespace as one space.

    ASCII text (nearly every completion) skips NFKC and casefold, which are the identity and `lower()`
    on ASCII; `str.split()` splits on exactly the characters `re`'s `\\s` matches."""
    folded = text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.split())


# str.split()'s whitespace among ASCII characters: \t \n \v \f \r, the separators \x1c-\x1f, and space.
_ASCII_SPACES = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"
_ASCII_FOLD = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ" + _ASCII_SPACES, b"abcdefghijklmnopqrstuvwxyz" + b" " * len(_ASCII_SPACES)
)


def normalised_utf8(texts: Sequence[str]) -> list[bytes]:
    """`normalise(text).encode("utf-8")` of each text: the ASCII texts (nearly every completion) by
    `sapo_native.normalise_ascii` or its twin, the others one by one."""
    fast = native()
    out: list[bytes | None] = fast.normalise_ascii(list(texts)) if fast is not None else _normalised_ascii(texts)
    return [normalise(t).encode("utf-8") if o is None else o for t, o in zip(texts, out, strict=True)]


def _normalised_ascii(texts: Sequence[str]) -> list[bytes | None]:
    """`sapo_native.normalise_ascii`'s twin: the normalised bytes of each ASCII text, None for the others
    (and for every text when one holds a NUL, the batch's separator). The ASCII texts are normalised
    together, as bytes: one join, one translate (case and whitespace), runs of spaces halved until none
    is left, one split. `normalise` splits every text into words, a string object per word."""
    out: list[bytes | None] = [None] * len(texts)
    batch = [i for i, t in enumerate(texts) if t.isascii()]
    joined = "\x00".join([texts[i] for i in batch]).encode("ascii")
    if batch and joined.count(b"\x00") == len(batch) - 1:
        folded = joined.translate(_ASCII_FOLD)
        while b"  " in folded:  # a run of k spaces takes log2(k) passes
            folded = folded.replace(b"  ", b" ")
        for i, part in zip(batch, folded.split(b"\x00"), strict=True):
            out[i] = part.strip(b" ")
    return out


def question_hashes(questions: Sequence[str]) -> list[str]:
    """The key of each question's fingerprints: the SHA-1 of its normalised text (normalised together,
    `normalised_utf8`)."""
    return [hashlib.sha1(q).hexdigest() for q in normalised_utf8(questions)]  # noqa: S324 - a key, not a secret


_FNV = np.uint64(1099511628211)
_ONE = np.uint64(1)
_S33 = np.uint64(33)
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
# Bit counting 8 bits per uint64 add: word j of a hash keeps its bits j, 8+j, ..., 56+j, one in each 8-bit
# lane. A lane holds at most 255, so a text's windows are summed in chunks of at most _CHUNK, and the
# chunks' counts added per text once the lanes are apart. (16-bit lanes needed no chunks but twice the
# passes over the hashes: 16 shifts and masks instead of 8, most of the simhash's time.)
_LANE_MASK = np.uint64(0x0101010101010101)
_LANES = np.arange(0, 64, 8, dtype=np.uint64)
_LANE_BITS = np.uint64(0xFF)
_CHUNK = 255


def simhashes(normalised: Sequence[str]) -> list[int]:
    """The 64-bit simhash of each text's byte 4-grams (first SIMHASH_CHARS characters), as a signed int
    (fits PostgreSQL bigint and JSON). Near-identical texts differ in few bits.

    Every gram of a text gets a 64-bit hash (FNV-style over its 4 bytes, then murmur3's finaliser, which
    spreads every input bit over all 64 output bits); bit b of the simhash is set when more than half the
    grams have it set. All texts are hashed in one numpy pass over their concatenation (a text shorter
    than 4 bytes is padded with zero bytes); the windows straddling two texts are computed and ignored.
    """
    return _simhashes([t[:SIMHASH_CHARS].encode("utf-8") for t in normalised]).tolist()


def _simhashes(datas: list[bytes]) -> np.ndarray:
    """`simhashes` of texts already cut to SIMHASH_CHARS characters and encoded, as int64."""
    fast = native()
    if fast is not None:
        return np.frombuffer(fast.simhashes(datas), dtype="<i8")
    return _simhashes_numpy(datas)


def _simhashes_numpy(datas: list[bytes]) -> np.ndarray:
    """`sapo_native.simhashes`' numpy twin.

    A share's ~77 KB of completions make 616 KB arrays of uint64: the work arrays are kept per
    thread (`_work`) and every step writes into them, since a fresh array that size costs its page
    faults each time (a third of the time before). The gram hash (b0+1)F^3 + (b1+1)F^2 + (b2+1)F +
    (b3+1) is taken as b0F^3 + b1F^2 + b2F + b3 plus that constant (the same value, mod 2^64)."""
    if not datas:
        return np.empty(0, dtype=np.int64)
    m = len(datas)
    datas = [d if len(d) >= SHINGLE else d + bytes(SHINGLE - len(d)) for d in datas]
    lengths = np.fromiter(map(len, datas), dtype=np.int64, count=m)
    size = int(lengths.sum())
    n = size - SHINGLE + 1
    raw, h, spare = _work(size)
    h, spare = h[:n], spare[:n]
    np.copyto(raw, np.frombuffer(b"".join(datas), dtype=np.uint8), casting="unsafe")
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as intended
        np.multiply(raw[:n], _FNV, out=h)
        for k in range(1, SHINGLE):
            np.add(h, raw[k : k + n], out=h)
            if k < SHINGLE - 1:
                np.multiply(h, _FNV, out=h)
        np.add(h, _GRAM_CONSTANT, out=h)
        for mix in (_MIX1, _MIX2, None):
            np.right_shift(h, _S33, out=spare)
            np.bitwise_xor(h, spare, out=h)
            if mix is not None:
                np.multiply(h, mix, out=h)
    windows = lengths - SHINGLE + 1  # (m,), each >= 1
    starts = np.cumsum(lengths) - lengths
    # Text t's windows [starts[t], starts[t] + windows[t]) in chunks of at most _CHUNK; reduceat's
    # boundaries are each text's chunk starts, then the start of the windows straddling it and the next.
    chunks = (windows + _CHUNK - 1) // _CHUNK  # (m,)
    first_chunk = np.cumsum(chunks) - chunks
    text_of = np.repeat(np.arange(m), chunks)  # (c,): each chunk's text
    within = np.arange(text_of.size) - first_chunk[text_of]
    bounds = np.empty(text_of.size + m, dtype=np.int64)
    at_chunk = np.arange(text_of.size) + text_of  # each text's boundaries come after the earlier texts' gaps
    bounds[at_chunk] = starts[text_of] + within * _CHUNK
    bounds[first_chunk + chunks + np.arange(m)] = starts + windows
    if bounds[-1] == n:
        bounds = bounds[:-1]
    sums = np.empty((8, text_of.size), dtype="<u8")  # (8 j, c)
    spread = spare
    for j in range(8):
        np.right_shift(h, np.uint64(j), out=spread)
        np.bitwise_and(spread, _LANE_MASK, out=spread)
        sums[j] = np.add.reduceat(spread, bounds)[at_chunk]
    # Byte `lane` of sums[j] (little-endian) is the count of bit 8 * lane + j: read as bytes, no shifts.
    ones = sums.view(np.uint8).reshape(8, text_of.size, 8)  # (8 j, c, 8 lanes)
    ones = ones.transpose(1, 2, 0).reshape(text_of.size, 64).astype(np.int32)  # (c, 64): bit b in column b
    ones = np.add.reduceat(ones, first_chunk, axis=0)  # (m, 64)
    majority = 2 * ones > windows[:, None]
    return np.packbits(majority, axis=1, bitorder="little").view("<i8").ravel()


_GRAM_CONSTANT = np.uint64((((1 * 1099511628211 + 1) * 1099511628211 + 1) * 1099511628211 + 1) % 2**64)
_local = threading.local()


def _work(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's three uint64 work arrays, at least `size` long (the raw bytes, the hashes, and
    one for intermediate results), as views of exactly `size`."""
    arrays = getattr(_local, "arrays", None)
    if arrays is None or arrays[0].size < size:
        capacity = max(size, 2 * (arrays[0].size if arrays is not None else 0), 1 << 16)
        arrays = _local.arrays = tuple(np.empty(capacity, dtype=np.uint64) for _ in range(3))
    return tuple(a[:size] for a in arrays)


def simhash(normalised: str) -> int:
    """The simhash of one text (see `simhashes`)."""
    return simhashes([normalised])[0]


def hamming(a: int, b: int) -> int:
    return ((a ^ b) & _MASK64).bit_count()


#: Simhashes are cut in 4 bands of 16 bits. Two hashes within Hamming distance 3 share at least one band
#: exactly (pigeonhole), so near copies are found by looking up 4 band values, never by comparing all pairs.
BANDS = 4
#: At most this many candidates are kept per band value (the first ones added): a degenerate band (very
#: common text) stays bounded.
BAND_BUCKET = 64


_BAND_TAGS = np.arange(BANDS, dtype=np.uint64)[:, None] << np.uint64(16)


def _tagged_band_keys(hashes: np.ndarray) -> np.ndarray:
    """(BANDS, n) band values of uint64 hashes, each tagged with its band: row i holds bits 16*i .. 16*i+15,
    plus i * 2**16 (one sorted array then serves all the bands)."""
    shifts = np.arange(BANDS, dtype=np.uint64)[:, None] * np.uint64(16)
    return ((hashes[None, :] >> shifts) & np.uint64(0xFFFF)) | _BAND_TAGS


#: Bytes of an exact fingerprint (a 128-bit BLAKE2b digest).
EXACT_BYTES = 16


class Fingerprint(msgspec.Struct, frozen=True):
    """A group's fingerprints (a msgspec Struct: one is built per group of every share, faster than a
    frozen dataclass)."""

    exact: list[bytes]  # 16-byte BLAKE2b digest of each normalised completion
    simhash: list[int]
    lengths: list[int]  # normalised length of each completion
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
    array = _simhashes(
        [
            e if n <= SIMHASH_CHARS or len(e) <= SIMHASH_CHARS else e.decode("utf-8")[:SIMHASH_CHARS].encode("utf-8")
            for e, n in zip(encoded, lengths, strict=True)
        ]
    )
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
                simhash_packed=packed[8 * at : 8 * end],
            )
        )
        at = end
    return out


class CopyIndex:
    """The completions of other nodes' recent groups, for exact and near lookups, held as the bytes the
    database returns (RolloutFingerprint's columns concatenated): no Python object per
    candidate completion. A share's candidates reach 50 groups per question, ~13,000 completions for a
    share of 32 questions: decoding them as JSON and indexing them one by one would cost more than the
    rest of the share (docs/benchmarks.md, "How ingest is made fast").

    Exact: each probe digest is looked up among the candidates' (the first group holding it, in the
    order added): in C, a table of the probes' digests and one pass over the candidates
    (sapo_native.exact_first); in numpy, the candidates first filtered through a table of 16 bits of
    the probes' digests.
    Near: the candidates sharing a band value with some probe are found through a table of the probes'
    tagged band values (not by sorting every candidate's); among those, per band value the first
    BAND_BUCKET candidates in the order added, bands in order, and the first within the distance.
    """

    def __init__(self, ids: bytes = b"", counts: Sequence[int] = (), exact: bytes = b"", hashes: bytes = b"") -> None:
        """The groups as the screening query returns them, in order (none by default): `ids` their UUIDs
        (16 bytes each), `counts` their completions, `exact` and `hashes` their fingerprints
        concatenated (RolloutFingerprint's columns). Raises ValueError when the sizes disagree."""
        total = sum(counts)
        if len(ids) != 16 * len(counts) or len(exact) != EXACT_BYTES * total or len(hashes) != 8 * total:
            raise ValueError("fingerprint buffers of inconsistent sizes")
        self._ids, self._counts, self._exact, self._hashes = ids, tuple(counts), exact, hashes
        self._ends: list[int] | None = None  # each group's end among the completions, once a match needs it

    def after(self, groups: Sequence[tuple[uuid.UUID, Fingerprint]]) -> CopyIndex:
        """A new index holding `groups` (id and fingerprint, in order) first, then this one's."""
        if not groups:
            return self
        return CopyIndex(
            b"".join(rid.bytes for rid, _ in groups) + self._ids,
            [len(fp.exact) for _, fp in groups] + list(self._counts),
            b"".join(fp.exact_bytes() for _, fp in groups) + self._exact,
            b"".join(fp.simhash_packed for _, fp in groups) + self._hashes,
        )

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
        fast = native()
        if fast is not None:
            return [None if c < 0 else self._group_id(c) for c in fast.exact_first(exact, b"".join(digests))]
        # A first pass on 16 bits of each digest (a table lookup per candidate, cheaper than a binary
        # search among the probes at ~13,000 candidates), then whole digests for the few that pass.
        table = np.zeros(1 << 16, dtype=bool)
        table[np.frombuffer(b"".join(digests), dtype=np.uint16)[:: EXACT_BYTES // 2]] = True
        first: dict[bytes, int] = {}
        # The candidates that may be copies (the copies, and the few others whose 16 bits a probe has), in order.
        for c in np.flatnonzero(table[np.frombuffer(exact, dtype=np.uint16)[:: EXACT_BYTES // 2]]).tolist():
            first.setdefault(exact[EXACT_BYTES * c : EXACT_BYTES * (c + 1)], c)
        for i, digest in enumerate(digests):
            c = first.get(digest)
            if c is not None:
                found[i] = self._group_id(c)
        return found

    def near_matches(self, hashes: Sequence[int], max_distance: int) -> list[str | None]:
        """For each simhash, the first candidate group within `max_distance` bits (bands in order, then
        candidates in the order added, at most BAND_BUCKET per band value), or None.

        Every (hash, band, candidate sharing the band value) pair is checked in that order, and each hash
        keeps its first pair within the distance: in C (sapo_native.near_first) or, without it, in one
        numpy pass (a Python loop over the pairs cost more than the rest of the lookup: honest
        completions on one question share many bands)."""
        found: list[str | None] = [None] * len(hashes)
        if not hashes or not self._hashes:
            return found
        fast = native()
        if fast is not None:
            hits = fast.near_first(self._hashes, list(hashes), max_distance, BAND_BUCKET)
            return [None if c < 0 else self._group_id(c) for c in hits]
        candidates = np.frombuffer(self._hashes, dtype=">u8").astype(np.uint64)
        n = candidates.size
        probes = np.array(hashes, dtype=np.int64).view(np.uint64)
        wanted = _tagged_band_keys(probes).T.ravel()  # hash-major: each hash's bands in order
        all_keys = _tagged_band_keys(candidates).ravel()  # band-major: a band's values in the order added
        # What shares a band value with some hash, in order: a table of the hashes' tagged band values
        # (a lookup per candidate band, cheaper than a binary search among them).
        table = np.zeros(BANDS << 16, dtype=bool)
        table[wanted] = True
        shared = np.flatnonzero(table[all_keys])
        if not shared.size:
            return found
        order = np.argsort(all_keys[shared], kind="stable")  # equal values keep the order added
        keys, candidate_of = all_keys[shared][order], shared[order] % n
        starts = np.searchsorted(keys, wanted, side="left")
        counts = np.minimum(np.searchsorted(keys, wanted, side="right") - starts, BAND_BUCKET)
        total = int(counts.sum())
        if not total:
            return found
        range_of = np.repeat(np.arange(counts.size), counts)  # each pair's range: hash * BANDS + band
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        pairs = candidate_of[starts[range_of] + offsets]  # each pair's candidate
        near = np.flatnonzero(np.bitwise_count(probes[range_of // BANDS] ^ candidates[pairs]) <= max_distance)
        hit_probes, first = np.unique(range_of[near] // BANDS, return_index=True)  # pairs in order: the first hit
        for j, c in zip(hit_probes.tolist(), pairs[near[first]].tolist(), strict=True):
            found[j] = self._group_id(c)
        return found


def copy_findings(
    fps: Sequence[Fingerprint], index: CopyIndex, rule: Rule, *, near: bool
) -> list[tuple[str, list[str]] | None]:
    """Per group: (detail, [source rollout ids]) when at least `min_share` of its completions of at least
    `min_chars` normalised characters copy another node's; None otherwise (or when none are long).
    The near lookups of all the groups are one vectorised call."""
    min_chars = rule["min_chars"]
    probes: list = []
    chosen: list[int] = []  # per group, how many of its completions are long enough (probes, in order)
    for fp in fps:
        values = fp.simhash if near else fp.exact
        if min(fp.lengths, default=min_chars) >= min_chars:  # all of them (honest groups nearly always)
            probes += values
            chosen.append(len(values))
        else:
            kept = [v for v, n in zip(values, fp.lengths, strict=True) if n >= min_chars]
            probes += kept
            chosen.append(len(kept))
    flat = index.near_matches(probes, rule["max_distance"]) if near else index.exact_matches(probes)
    if not any(flat):  # no completion copies anything (nearly every share)
        return [None] * len(fps)
    findings: list[tuple[str, list[str]] | None] = []
    at = 0
    for count in chosen:
        sources = [m for m in flat[at : at + count] if m is not None]
        at += count
        if not sources or len(sources) / count < rule["min_share"]:
            findings.append(None)
            continue
        kind = "near copies" if near else "exact copies"
        detail = f"{len(sources)} of {count} completions are {kind} of other nodes' groups"
        findings.append((detail, sorted(set(sources))))
    return findings


# --- length and character classes -----------------------------------------------------------------


#: Non-printable: controls other than tab/newline/carriage return, zero-width and bidi marks, BOM; as a
#: lookup table over the Basic Multilingual Plane (no code point above it is in these ranges).
_NONPRINTABLE = ((0x00, 0x08), (0x0B, 0x0C), (0x0E, 0x1F), (0x7F, 0x9F), (0x200B, 0x200F), (0x202A, 0x202E),
                 (0x2060, 0x2064), (0xFEFF, 0xFEFF))  # fmt: skip
_NONPRINTABLE_TABLE = np.zeros(0x10001, dtype=bool)  # the last entry stands for every code point above the BMP
for _lo, _hi in _NONPRINTABLE:
    _NONPRINTABLE_TABLE[_lo : _hi + 1] = True


_NONPRINTABLE_ASCII = bytes(c for c in range(128) if _NONPRINTABLE_TABLE[c])


def _segment_sums(mask: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Per i, how many of mask[starts[i]:stops[i]] are set (segments in order, apart, maybe empty). One
    reduceat (a cumulative sum over the whole mask cost ten times more)."""
    bounds = np.empty(2 * len(starts), dtype=np.int64)
    bounds[0::2] = starts
    bounds[1::2] = stops
    np.minimum(bounds, len(mask), out=bounds)  # only empty segments start past the mask's end
    padded = np.concatenate((mask, [False]))  # a bound equal to len(mask) stays in range
    sums = np.add.reduceat(padded, bounds, dtype=np.int64)[0::2]
    return np.where(stops > starts, sums, 0)  # reduceat gives an empty segment its first element


def _counts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per text: its length and how many of its characters are non-printable, non-ASCII, and repeated
    (equal to the previous one)."""
    fast = native()
    if fast is not None:
        counts = np.frombuffer(fast.char_counts(list(texts)), dtype="<i8").reshape(len(texts), 4).T
        return counts[0], counts[1], counts[2], counts[3]
    return _counts_numpy(texts)


def _counts_numpy(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`sapo_native.char_counts`' numpy twin: all texts in one pass over their concatenated code points
    (bytes, when all are ASCII, as nearly every share is)."""
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    joined = "".join(texts)
    if joined.isascii():
        data = joined.encode("ascii")
        codes = np.frombuffer(data, dtype=np.uint8)
        non_ascii = np.zeros(len(texts), dtype=np.int64)
        if len(data.translate(None, _NONPRINTABLE_ASCII)) == len(data):
            nonprintable = non_ascii
        else:
            nonprintable = _segment_sums(_NONPRINTABLE_TABLE[codes], starts, ends)
    else:
        codes = np.frombuffer(joined.encode("utf-32-le"), dtype=np.uint32)
        nonprintable = _segment_sums(_NONPRINTABLE_TABLE[np.minimum(codes, 0x10000)], starts, ends)
        non_ascii = _segment_sums(codes > 127, starts, ends)
    # pair k is (k, k + 1) and counts for the text holding both: its pairs are [start, end - 1)
    repeated = _segment_sums(codes[1:] == codes[:-1], starts, np.maximum(starts, ends - 1))
    return lengths, nonprintable, non_ascii, repeated


def length_findings(groups: Sequence[Sequence[str]], rule: Rule) -> list[str | None]:
    """Per group: its first completion breaking a length or character-class limit, described; None if
    all pass. The character counts of all groups' completions are computed and compared in one pass;
    only a group with a completion over a limit is looked at completion by completion."""
    floor = max(1, rule["min_chars_for_shares"])
    texts = [t for completions in groups for t in completions]
    lengths, *counts = _counts(texts)
    limits = (rule["max_nonprintable_share"], rule["max_non_ascii_share"], rule["max_repeat_share"])
    over = lengths > rule["max_chars"]
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
        if n > rule["max_chars"]:
            return f"completion {i + 1} has {n} characters (limit {rule['max_chars']})"
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
