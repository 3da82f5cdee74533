"""How fast the moderation rules' per-item loops are computed: each in C (`sapo_native`, native/) when
the extension is installed and SAPO_NATIVE is on (common.native), else in its numpy or Python twin
here, with the same results bit for bit (tests/platform/test_native.py holds each pair, and the
definitions, together). The rules (moderation.filters) say what a copy or an over-long text is and
call these; they read the same either way. The twins cost more CPU (docs/benchmarks.md, "Ingest")."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from common.native import native
from sapo_node import protocol

# --- normalising ----------------------------------------------------------------------------------

# str.split()'s whitespace among ASCII characters: \t \n \v \f \r, the separators \x1c-\x1f, and space.
_ASCII_SPACES = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f"
_ASCII_FOLD = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ" + _ASCII_SPACES, b"abcdefghijklmnopqrstuvwxyz" + b" " * len(_ASCII_SPACES)
)


def normalised_ascii(texts: Sequence[str]) -> list[bytes | None]:
    """The normalised bytes of each ASCII text (moderation.filters.normalise), None for the others."""
    fast = native()
    return fast.normalise_ascii(list(texts)) if fast is not None else normalised_ascii_numpy(texts)


def normalised_ascii_numpy(texts: Sequence[str]) -> list[bytes | None]:
    """`sapo_native.normalise_ascii`'s twin: the normalised bytes of each ASCII text, None for the others.
    The ASCII texts are normalised together, as bytes: one join, one translate (case and whitespace),
    runs of spaces halved until none is left, one split; `normalise` splits every text into words, a
    string object per word. A batch where a text holds a NUL (the join's separator) is normalised
    text by text instead."""
    out: list[bytes | None] = [None] * len(texts)
    batch = [i for i, t in enumerate(texts) if t.isascii()]
    joined = "\x00".join([texts[i] for i in batch]).encode("ascii")
    if joined.count(b"\x00") != len(batch) - 1:
        for i in batch:
            out[i] = " ".join(texts[i].lower().split()).encode("ascii")
    elif batch:
        folded = joined.translate(_ASCII_FOLD)
        while b"  " in folded:  # a run of k spaces takes log2(k) passes
            folded = folded.replace(b"  ", b" ")
        for i, part in zip(batch, folded.split(b"\x00"), strict=True):
            out[i] = part.strip(b" ")
    return out


# --- simhashes ------------------------------------------------------------------------------------

#: Bytes of a gram.
SHINGLE = 4

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


def simhashes(datas: list[bytes]) -> np.ndarray:
    """The simhash of each text's byte grams (moderation.filters.simhashes says what it is), of texts
    already cut and encoded, as int64."""
    fast = native()
    if fast is not None:
        return np.frombuffer(fast.simhashes(datas), dtype="<i8")
    return simhashes_numpy(datas)


def simhashes_numpy(datas: list[bytes]) -> np.ndarray:
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


# --- copy lookups ---------------------------------------------------------------------------------

#: Bytes of an exact fingerprint (a 128-bit BLAKE2b digest).
EXACT_BYTES = 16


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


def exact_first(candidates: bytes, digests: Sequence[bytes]) -> list[int]:
    """For each digest (EXACT_BYTES each), the first candidate completion (in the order added) whose
    digest it is, as its index among `candidates` (their digests concatenated), or -1: in C, a table of
    the probes' digests and one pass over the candidates; in numpy, the candidates first filtered
    through a table of 16 bits of the probes' digests."""
    fast = native()
    if fast is not None:
        return list(fast.exact_first(candidates, b"".join(digests)))
    # A first pass on 16 bits of each digest (a table lookup per candidate, cheaper than a binary
    # search among the probes at ~13,000 candidates), then whole digests for the few that pass.
    table = np.zeros(1 << 16, dtype=bool)
    table[np.frombuffer(b"".join(digests), dtype=np.uint16)[:: EXACT_BYTES // 2]] = True
    first: dict[bytes, int] = {}
    # The candidates that may be copies (the copies, and the few others whose 16 bits a probe has), in order.
    for c in np.flatnonzero(table[np.frombuffer(candidates, dtype=np.uint16)[:: EXACT_BYTES // 2]]).tolist():
        first.setdefault(candidates[EXACT_BYTES * c : EXACT_BYTES * (c + 1)], c)
    return [first.get(digest, -1) for digest in digests]


def near_first(candidates: bytes, probes_in: Sequence[int], max_distance: int, bucket: int) -> list[int]:
    """For each simhash, the first candidate completion within `max_distance` bits, as its index among
    `candidates` (their simhashes, 8 bytes big-endian each), or -1: every (hash, band, candidate sharing
    the band value, at most `bucket` per band value in the order added) pair in that order, each hash
    keeping its first pair within the distance. In C (sapo_native.near_first) or in one numpy pass (a
    Python loop over the pairs costs more than the rest of the lookup: honest completions on one
    question share many bands)."""
    fast = native()
    if fast is not None:
        return list(fast.near_first(candidates, list(probes_in), max_distance, bucket))
    first_hits = [-1] * len(probes_in)
    hashes_of = np.frombuffer(candidates, dtype=">u8").astype(np.uint64)
    n = hashes_of.size
    probes = np.array(probes_in, dtype=np.int64).view(np.uint64)
    wanted = _tagged_band_keys(probes).T.ravel()  # hash-major: each hash's bands in order
    all_keys = _tagged_band_keys(hashes_of).ravel()  # band-major: a band's values in the order added
    # What shares a band value with some hash, in order: a table of the hashes' tagged band values
    # (a lookup per candidate band, cheaper than a binary search among them).
    table = np.zeros(BANDS << 16, dtype=bool)
    table[wanted] = True
    shared = np.flatnonzero(table[all_keys])
    if not shared.size:
        return first_hits
    order = np.argsort(all_keys[shared], kind="stable")  # equal values keep the order added
    keys, candidate_of = all_keys[shared][order], shared[order] % n
    starts = np.searchsorted(keys, wanted, side="left")
    counts = np.minimum(np.searchsorted(keys, wanted, side="right") - starts, bucket)
    total = int(counts.sum())
    if not total:
        return first_hits
    range_of = np.repeat(np.arange(counts.size), counts)  # each pair's range: hash * BANDS + band
    offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    pairs = candidate_of[starts[range_of] + offsets]  # each pair's candidate
    near = np.flatnonzero(np.bitwise_count(probes[range_of // BANDS] ^ hashes_of[pairs]) <= max_distance)
    hit_probes, first = np.unique(range_of[near] // BANDS, return_index=True)  # pairs in order: the first hit
    for j, c in zip(hit_probes.tolist(), pairs[near[first]].tolist(), strict=True):
        first_hits[j] = c
    return first_hits


# --- character counts (the characters rule) -------------------------------------------------------

#: Non-printable (sapo_node.protocol.NONPRINTABLE, what the node's sampler never writes either), as a
#: lookup table over the Basic Multilingual Plane (no code point above it is in these ranges).
NONPRINTABLE = protocol.NONPRINTABLE
_NONPRINTABLE_TABLE = np.zeros(0x10001, dtype=bool)  # the last entry stands for every code point above the BMP
for _lo, _hi in NONPRINTABLE:
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


def char_counts(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per text: its length and how many of its characters are non-printable, non-ASCII, and repeated
    (equal to the previous one)."""
    fast = native()
    if fast is not None:
        counts = np.frombuffer(fast.char_counts(list(texts)), dtype="<i8").reshape(len(texts), 4).T
        return counts[0], counts[1], counts[2], counts[3]
    return char_counts_numpy(texts)


def char_counts_numpy(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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
        # surrogatepass: a lone surrogate is a code point like any other, as sapo_native.char_counts reads it
        codes = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        nonprintable = _segment_sums(_NONPRINTABLE_TABLE[np.minimum(codes, 0x10000)], starts, ends)
        non_ascii = _segment_sums(codes > 127, starts, ends)
    # pair k is (k, k + 1) and counts for the text holding both: its pairs are [start, end - 1)
    repeated = _segment_sums(codes[1:] == codes[:-1], starts, np.maximum(starts, ends - 1))
    return lengths, nonprintable, non_ascii, repeated
