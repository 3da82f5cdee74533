"""Proof of inference, the parts both sides compute (docs/protocol.md, "Proof of work"): the questions a
server challenge names, the random stream each completion is drawn from, and the wire encoding of
token ids and per-token log-probabilities. Pure functions over hashlib, struct and base64: the node
client samples with them, the server's verifier and audit worker check with them, and neither needs
the other's code or torch.

A challenge is an opaque string the server issues (`welcome.challenge`, `ack.challenge`). Everything
below is a function of it, so a node cannot pick its questions or its random draws: given the node's
weights, the prompt and the challenge, each completion is determined.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

#: How many questions one challenge names (its indices j = 0..QUESTIONS_PER_CHALLENGE-1): enough for
#: the fastest built-in model's rounds between two fresh challenges (SAPO_CHALLENGE_SECONDS), few
#: against the 10^9 indices a node could otherwise choose among.
QUESTIONS_PER_CHALLENGE = 4096
#: A challenge's length bound on the wire.
MAX_CHALLENGE_CHARS = 128
#: A task seed is in [0, SEED_BOUND) and an index in [0, INDEX_BOUND): sapo_node.tasks.MAX_SEED + 1
#: and sapo_node.datasets.MAX_INDEX (tests/node/test_proof.py holds them equal; not imported, since
#: those modules import reasoning-gym and this one imports nothing heavy).
SEED_BOUND = 2**31
INDEX_BOUND = 10**9
#: The models an audit can replay: the ones every site rebuilds from its own copy, the built-in models
#: (sapo_node.tiny.variants.VARIANTS) and the packaged SmolLM2 (sapo_node.packaged.PACKAGED), named here without
#: importing torch (tests/node/test_proof.py holds them equal). A proof naming any other model is
#: stored unaudited: no audit could check it, so it can earn no credit and no node is held for it.
AUDITABLE_MODELS = frozenset(
    {"small", "tiny", "tiny-learn", "tiny-learn-a", "tiny-learn-b", "tiny-mini", "tiny-sparse", "smollm2-135m"}
)
#: Bytes of a weights digest (sha256), as 64 lowercase hex characters on the wire.
DIGEST_HEX_CHARS = 64


def _h(*parts: str | int | bytes) -> bytes:
    """sha256 over length-prefixed parts, so no two part lists share an encoding."""
    h = hashlib.sha256()
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        h.update(struct.pack("<I", len(raw)))
        h.update(raw)
    return h.digest()


def task_seed(challenge: str) -> int:
    """The reasoning-gym seed of every question the challenge names."""
    return int.from_bytes(_h("sapo/task-seed", challenge)[:8], "little") % SEED_BOUND


@functools.lru_cache(maxsize=4096)
def _progression(challenge: str) -> tuple[int, int, int]:
    """(first index, step, the step's inverse modulo INDEX_BOUND): a challenge's questions are an
    arithmetic progression modulo INDEX_BOUND, so the server tells which question an index is with one
    multiplication. The step is odd and not a multiple of 5, hence invertible modulo 10^9."""
    first = int.from_bytes(_h("sapo/task-first", challenge)[:8], "little") % INDEX_BOUND
    step = int.from_bytes(_h("sapo/task-step", challenge)[:8], "little") % INDEX_BOUND | 1
    if step % 5 == 0:
        step = (step + 2) % INDEX_BOUND
    return first, step, pow(step, -1, INDEX_BOUND)


def task_index(challenge: str, j: int) -> int:
    """The index of the challenge's question j (0 <= j < QUESTIONS_PER_CHALLENGE)."""
    if not 0 <= j < QUESTIONS_PER_CHALLENGE:
        raise ValueError(f"question {j} is outside [0, {QUESTIONS_PER_CHALLENGE})")
    first, step, _ = _progression(challenge)
    return (first + j * step) % INDEX_BOUND


def question_number(challenge: str, index: int) -> int | None:
    """The j whose question the index is under the challenge, or None when the challenge names no such
    question."""
    if not 0 <= index < INDEX_BOUND:
        return None
    first, _, inverse = _progression(challenge)
    j = (index - first) * inverse % INDEX_BOUND
    return j if j < QUESTIONS_PER_CHALLENGE else None


def task_indices(challenge: str) -> list[int]:
    """Every index the challenge names, in order of j."""
    return [task_index(challenge, j) for j in range(QUESTIONS_PER_CHALLENGE)]


def completion_key(challenge: str, dataset: str, seed: int, index: int, k: int) -> bytes:
    """The 32-byte key of completion k of the group that answers (dataset, seed, index) under the
    challenge: one key per completion, independent of the group's id, so regenerating a question under
    a fresh id draws the same stream."""
    return _h("sapo/completion", challenge, dataset, seed, index, k)


def uniforms(key: bytes, n: int) -> list[float]:
    """The first n draws in [0, 1) of the completion's stream: token t is drawn with draw t. Each is
    the top 53 bits of a little-endian uint64 of SHAKE-256(key), so any machine computes the same."""
    if n <= 0:
        return []
    raw = hashlib.shake_256(b"sapo/uniforms" + key).digest(8 * n)
    return [(x >> 11) * (1.0 / (1 << 53)) for x in struct.unpack(f"<{n}Q", raw)]


def encode_ids(ids: Sequence[int]) -> str:
    """Token ids as base64 of little-endian uint32."""
    return base64.b64encode(struct.pack(f"<{len(ids)}I", *ids)).decode("ascii")


def decode_ids(text: str) -> list[int]:
    """encode_ids' inverse; ValueError when the text is not base64 of whole uint32s."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("token ids are not whole uint32s")
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def encode_floats(values: Iterable[float]) -> str:
    """Per-token log-probabilities as base64 of little-endian float32."""
    values = list(values)
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


def decode_floats(text: str) -> list[float]:
    """encode_floats' inverse; ValueError when the text is not base64 of whole float32s."""
    raw = base64.b64decode(text, validate=True)
    if len(raw) % 4:
        raise ValueError("log-probabilities are not whole float32s")
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read 1 MiB at a time: a checkpoint the node uploads and the server
    checks, a prebuilt model's files, a wheel."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def weights_digest(tensors: Iterable[tuple[str, str, Sequence[int], bytes | memoryview]]) -> str:
    """The commitment to a model's weights: sha256 over (name, dtype, shape, raw little-endian bytes) of
    each tensor, in name order, whatever file format carried them. `tensors` yields
    (name, dtype name such as "float32", shape, bytes)."""
    h = hashlib.sha256(b"sapo/weights/1")
    for name, dtype, shape, data in sorted(tensors, key=lambda t: t[0]):
        header = f"{name}\0{dtype}\0{','.join(str(int(s)) for s in shape)}\0{len(data)}\0".encode()
        h.update(struct.pack("<I", len(header)))
        h.update(header)
        h.update(data)
    return h.hexdigest()
