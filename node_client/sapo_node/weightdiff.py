"""A checkpoint as its difference from a public base model (docs/protocol.md, "Checkpoint as a
difference"): what a node uploads for an audit when its model starts from weights the server holds too
(the built-in models and the packaged SmolLM2), instead of the whole file.

Exact: each element's bit pattern minus the base's (the base cast to the tensor's dtype), as integers
of the element's width modulo 2^width, zigzag-coded (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...: a small
difference of either sign has zero high bytes), its bytes laid out plane by plane (every element's
byte 0, then every byte 1, ...: a small update leaves the sign, exponent and high mantissa bits of a
weight alone, so the high planes are zeros), each tensor compressed alone with zlib. Reconstruction
adds the difference back, so the weights are bit for bit the committed ones, and their weights_digest
is checked against the commitment before anything reads them. (The integer difference compresses to
6% fewer bytes than the bits' XOR on an updated tiny-mini: a carry flips bits above the change.)

The file:

    b"SAPODIFF"                      8 bytes, the magic (a safetensors file starts with its header's
                                     length, a little-endian u64 far larger than this as a number)
    header length                    u32, little-endian, at most MAX_HEADER_BYTES
    header                           JSON, UTF-8 (DiffHeader)
    one zlib stream per tensor       in the header's order, each of the length the header says

The header parses without torch (`read_header`): the site's upload endpoint checks the format, the base
and the decompressed size before queueing; the audit worker decompresses each tensor with its known
length as a bound, so a stream that inflates past it is refused after that many bytes.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sapo_node import proof

MAGIC = b"SAPODIFF"
FORMAT = 1
CODEC = "zlib"
TRANSFORM = "zigzag-delta-byteplanes"
#: Bounds on a header: its bytes, its tensors, a name's characters, a shape's dimensions.
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 4096
MAX_NAME_CHARS = 300
MAX_DIMS = 8
#: zlib's level: 1 compresses the planes of zeros as well as 9 does, several times faster.
LEVEL = 1
#: Bytes a decompression produces per call (the reconstruction's working memory beyond the tensors).
INFLATE_STEP = 1 << 24
#: Element sizes of the dtypes a checkpoint may hold, by their names in a weights digest.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8, "int32": 4, "bool": 1}
_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


class DiffError(ValueError):
    """A file that is no valid difference, with a stable code: `bad_diff` (malformed, or not the base's
    tensors), `unknown_base` (not the base it names), `checkpoint_too_large` (past the size bound)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DiffTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    #: Bytes of its zlib stream in the file.
    stored: int

    @property
    def raw(self) -> int:
        """Bytes of the tensor (and of its stream once inflated)."""
        return math.prod(self.shape) * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class DiffHeader:
    #: The model family (proof.AUDITABLE_MODELS) whose base it is a difference from.
    model: str
    #: weights_digest of the base in float32, as sapo_node.models.load_policy(model, dtype=float32) gives it.
    base: str
    #: weights_digest of the weights it reconstructs (the audit's commitment).
    weights: str
    tensors: tuple[DiffTensor, ...]
    #: Bytes from the file's start to the first stream.
    data_offset: int

    @property
    def raw_bytes(self) -> int:
        return sum(t.raw for t in self.tensors)

    @property
    def stored_bytes(self) -> int:
        return sum(t.stored for t in self.tensors)


def is_diff(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _is_digest(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == proof.DIGEST_HEX_CHARS and all(c in "0123456789abcdef" for c in value)
    )


def read_header(f: IO[bytes], *, file_size: int) -> DiffHeader:
    """The header of a difference file (no torch); DiffError(`bad_diff`) when it is malformed or its
    streams do not fill the file exactly."""
    start = f.read(len(MAGIC) + 4)
    if len(start) != len(MAGIC) + 4 or start[: len(MAGIC)] != MAGIC:
        raise DiffError("bad_diff", "not a checkpoint difference (no SAPODIFF magic)")
    (length,) = struct.unpack("<I", start[len(MAGIC) :])
    if length > MAX_HEADER_BYTES:
        raise DiffError("bad_diff", f"the difference's header is {length} bytes, past {MAX_HEADER_BYTES}")
    try:
        raw = json.loads(f.read(length).decode("utf-8"))
        if raw["format"] != FORMAT or raw["codec"] != CODEC or raw["transform"] != TRANSFORM:
            raise DiffError("bad_diff", f"unsupported difference format {raw['format']!r} ({raw['codec']!r})")
        entries = raw["tensors"]
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_TENSORS:
            raise ValueError("tensors")
        tensors = tuple(
            DiffTensor(str(e["name"]), str(e["dtype"]), tuple(int(s) for s in e["shape"]), int(e["stored"]))
            for e in entries
        )
        model, base, weights = str(raw["model"]), raw["base"], raw["weights"]
    except DiffError:
        raise
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise DiffError("bad_diff", f"the difference's header is malformed ({exc})") from None
    names = [t.name for t in tensors]
    if (
        not _is_digest(base)
        or not _is_digest(weights)
        or len(set(names)) != len(names)
        or any(
            not 0 < len(t.name) <= MAX_NAME_CHARS
            or t.dtype not in DTYPE_BYTES
            or len(t.shape) > MAX_DIMS
            or any(s < 0 for s in t.shape)
            or t.stored < 0
            for t in tensors
        )
    ):
        raise DiffError("bad_diff", "the difference's header names a bad digest, tensor, dtype or shape")
    data_offset = len(MAGIC) + 4 + length
    if data_offset + sum(t.stored for t in tensors) != file_size:
        raise DiffError("bad_diff", "the difference's streams do not fill the file as its header says")
    return DiffHeader(model, base, weights, tensors, data_offset)


# ---------------------------------------------------------------------- torch from here on


def _bits(tensor: Any) -> Any:
    """The tensor's bit patterns as a flat numpy array of unsigned integers of its width (a view)."""
    import torch

    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.contiguous().reshape(-1).view(view).numpy().view(_UINT[tensor.element_size()])


def _zigzag(bits: Any, base: Any) -> Any:
    """(bits - base) modulo 2^width, zigzag-coded (unsigned)."""
    size = bits.itemsize
    d = (bits - base).view(_INT[size])
    return ((d << 1) ^ (d >> (8 * size - 1))).view(_UINT[size])


def _unzigzag(z: Any, base: Any) -> Any:
    """_zigzag's inverse: the bits whose difference from `base` is z."""
    return base + ((z >> 1) ^ (0 - (z & 1)).astype(z.dtype))


def write_diff(
    path: Path | str, tensors: Mapping[str, Any], base: Mapping[str, Any], *, model: str, base_digest: str, weights: str
) -> int:
    """Write `tensors` as their difference from `base` (float32 tensors of the same names and shapes);
    returns the file's bytes. ValueError when the names or shapes are not the base's."""
    if set(tensors) != set(base) or any(tuple(tensors[k].shape) != tuple(base[k].shape) for k in base):
        raise ValueError("the checkpoint's tensors are not the base model's (names or shapes differ)")
    streams, entries = [], []
    for name in sorted(tensors):
        t = tensors[name].detach().cpu()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {name}: dtype {dtype} cannot be sent as a difference")
        size = t.element_size()
        z = _zigzag(_bits(t), _bits(base[name].to(t.dtype))).view("uint8")
        stream = zlib.compress(z.reshape(-1, size).T.tobytes(), LEVEL)
        streams.append(stream)
        entries.append({"name": name, "dtype": dtype, "shape": list(t.shape), "stored": len(stream)})
    header = json.dumps(
        {
            "format": FORMAT,
            "codec": CODEC,
            "transform": TRANSFORM,
            "model": model,
            "base": base_digest,
            "weights": weights,
            "tensors": entries,
        },
        separators=(",", ":"),
    ).encode()
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<I", len(header)) + header)
        for stream in streams:
            f.write(stream)
    return Path(path).stat().st_size


def _inflate(data: bytes, raw: int, name: str) -> bytes:
    """The stream inflated to exactly `raw` bytes; never produces more than raw + 1."""
    inflater = zlib.decompressobj()
    out = bytearray()
    try:
        while len(out) <= raw:
            piece = inflater.decompress(data, min(INFLATE_STEP, raw + 1 - len(out)))
            data = inflater.unconsumed_tail
            out += piece
            if inflater.eof or not piece:
                break
    except zlib.error as exc:
        raise DiffError("bad_diff", f"tensor {name}: its stream is not zlib data ({exc})") from None
    if len(out) > raw:
        raise DiffError("checkpoint_too_large", f"tensor {name}: its stream inflates past its {raw} bytes")
    if len(out) != raw or not inflater.eof or inflater.unused_data or data:
        raise DiffError("bad_diff", f"tensor {name}: its stream is not its {raw} bytes")
    return bytes(out)


def read_diff(path: Path | str, base: Mapping[str, Any], *, base_digest: str, max_bytes: int) -> dict[str, Any]:
    """The tensors a difference file reconstructs from `base` (the site's own float32 copy, whose digest
    is `base_digest`). DiffError: `unknown_base` (the file names another base), `bad_diff` (malformed,
    or not the base's names and shapes), `checkpoint_too_large` (past `max_bytes`, or a stream
    inflating past its tensor). The caller checks the result's weights_digest."""
    import numpy as np
    import torch

    path = Path(path)
    with open(path, "rb") as f:
        header = read_header(f, file_size=path.stat().st_size)
        if header.base != base_digest:
            raise DiffError("unknown_base", "the difference names a base this site does not hold")
        if header.raw_bytes > max_bytes:
            raise DiffError("checkpoint_too_large", f"the checkpoint would be {header.raw_bytes} bytes")
        names = {t.name for t in header.tensors}
        if names != set(base) or any(tuple(base[t.name].shape) != t.shape for t in header.tensors):
            raise DiffError("bad_diff", "the difference's tensors are not the base model's (names or shapes)")
        out = {}
        for entry in header.tensors:
            dtype = getattr(torch, entry.dtype)
            size = DTYPE_BYTES[entry.dtype]
            planes = np.frombuffer(_inflate(f.read(entry.stored), entry.raw, entry.name), dtype=np.uint8)
            z = planes.reshape(size, -1).T.copy().view(_UINT[size]).reshape(-1)
            bits = _unzigzag(z, _bits(base[entry.name].to(dtype))).view(_INT[size] if size > 1 else "uint8")
            out[entry.name] = torch.from_numpy(bits).view(dtype).reshape(entry.shape)
    return out
