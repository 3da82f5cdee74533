"""Commitments: the weights a round's groups were generated with, kept for the server's audits.

Before a round generates under a server challenge the node commits to its weights: their digest
(`sapo_node.audit.model_digest`, which every proof of the round's groups names) and a safetensors file
of the state_dict, <out>/commitments/<digest>.safetensors, written to a temporary file, fsynced and
renamed, so a crash never leaves half a file under a digest's name. Weights an update left unchanged
keep their file (the same digest). The server may ask for the file in the ack of a share
(`ack.audits`, again in every `welcome` while it waits): the transport uploads it
(sapo_node.transport.upload). No pickle: the file holds tensors only.

A file is kept while
- a group generated with it waits for the pool's verdict (the ack may ask for an audit), or
- an audit of it is requested and its upload has not finished (up to the audit's deadline),
and deleted at the next round otherwise. Whatever holds it, a file whose groups still wait is deleted
once older than MAX_AGE_SECONDS (the server's challenge lifetime: a group shared later is stored
unaudited, so no audit can ask for it); one an audit holds goes at the audit's deadline.

Bounded: at most `max_count` files and `max_bytes` bytes. A round that would pass either bound (a node
offline for long, whose groups wait in the outbox, each round's weights kept for them) commits
nothing: its groups are shared without a proof (unaudited: they earn no credit, and no audit can fail
over them) and the log says so once, and once when commitments are written again. A disk that cannot
take the file does the same.

Audits held are written to holds.json beside the files, so a restarted node keeps what the server
asked for before its welcome repeats it.

A store given its model's base (`base`: the model's name, for a model the server holds too) uploads
a committed file as its difference from that base (sapo_node.weightdiff), made when an audit asks for
it, as `.diff-<audit id>.sapodiff` beside the files, and deleted with the audit's hold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from sapo_node import proof

log = logging.getLogger("sapo_node.commitments")

#: The folder of a run's commitments, inside --out.
FOLDER = "commitments"
SUFFIX = ".safetensors"
HOLDS = "holds.json"
DIFF_PREFIX, DIFF_SUFFIX = ".diff-", ".sapodiff"
#: Files kept at most (a checkpoint per round of weights whose groups wait, or that an audit asked for).
MAX_COUNT = 8
#: Bytes of files kept at most: 8 of SmolLM2-135M's float32 checkpoints (538 MB each) fit.
MAX_BYTES = 6 * 1024**3
#: Seconds a file whose groups still wait is kept: the server's challenge lifetime
#: (SAPO_CHALLENGE_TTL_SECONDS' default); a group shared later than that is unaudited.
MAX_AGE_SECONDS = 86_400


@dataclass(frozen=True)
class Commitment:
    """The weights a round generates with: their digest, their file, and what committing cost."""

    digest: str
    path: Path
    bytes: int
    #: Seconds spent on the digest and the file (0 written when the file was already there).
    seconds: float
    written: bool


def model_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The state_dict as CPU tensors, each its own contiguous copy where it shares memory with
    another (tied embeddings): safetensors stores every name, and the digest covers every name."""
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        tensors[name] = t
    return tensors


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """proof.weights_digest of CPU tensors, each as its own dtype's little-endian bytes."""
    return proof.weights_digest(
        (name, str(t.dtype).removeprefix("torch."), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().data)
        for name, t in tensors.items()
    )


def base_tensors(model: str, *, cache_dir: str | Path | None = None) -> tuple[str, dict[str, torch.Tensor]]:
    """(digest, tensors) of `model`'s base in float32 on the CPU, from the local copy (the node's cache,
    the site's SAPO_AUDIT_MODEL_CACHE): the weights a checkpoint's difference is taken from
    (sapo_node.weightdiff)."""
    from sapo_node.models import load_policy

    policy, _, _ = load_policy(model, device="cpu", cache_dir=cache_dir, dtype=torch.float32)
    tensors = model_tensors(policy)
    return tensors_digest(tensors), tensors


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CommitmentStore:
    """The commitments of one run folder. Thread-safe: the training thread commits and prunes, the
    transport's upload thread holds and releases."""

    def __init__(
        self,
        root: str | Path,
        *,
        max_count: int = MAX_COUNT,
        max_bytes: int = MAX_BYTES,
        max_age: float = MAX_AGE_SECONDS,
        clock: Callable[[], float] = time.time,
        base: str | None = None,
        base_cache: str | Path | None = None,
    ) -> None:
        self.root = Path(root)
        #: The model whose base a checkpoint is uploaded as a difference from (None: whole files), and
        #: the cache folder its copy is in (None: the node's default).
        self.base, self.base_cache = base if base in proof.AUDITABLE_MODELS else None, base_cache
        self.max_count, self.max_bytes, self.max_age = max_count, max_bytes, max_age
        self._clock = clock
        self._lock = threading.Lock()
        self._holds: dict[str, tuple[str, float]] = self._read_holds()  # audit id -> (digest, deadline)
        self._failing = False  # the last round could not commit (logged once until one does)
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ the training thread's side
    def commit(self, model: Any, *, keep: Collection[str] = ()) -> Commitment | None:
        """Commit to `model`'s weights, first deleting what nothing keeps (`keep`: digests whose groups
        wait for a verdict). None: not committed (a bound, or the disk), and the round's groups go
        without a proof."""
        return self.begin(model, keep=keep).result()

    def begin(self, model: Any, *, keep: Collection[str] = ()) -> Future[Commitment | None]:
        """`commit` on the store's own thread, so the digest and the file overlap the round's
        generation (which reads the weights and changes none); the round takes the result before its
        update changes them. A CPU model's tensors are its parameters themselves, not copies."""
        started = time.perf_counter()
        tensors = model_tensors(model)  # a GPU model's weights are copied to the CPU here, in order
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sapo-commit")
        return self._executor.submit(self._commit, tensors, set(keep), started)

    def _commit(self, tensors: dict[str, torch.Tensor], keep: set[str], started: float) -> Commitment | None:
        digest = tensors_digest(tensors)
        self.prune({*keep, digest})
        path = self.root / f"{digest}{SUFFIX}"
        if path.is_file():
            with contextlib.suppress(OSError):
                os.utime(path)  # its age counts from the newest round that used it
            return Commitment(digest, path, path.stat().st_size, time.perf_counter() - started, written=False)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        files = self.files()
        if len(files) + 1 > self.max_count or sum(files.values()) + size > self.max_bytes:
            self._give_up(
                f"{len(files)} commitments of {sum(files.values()) / 1e6:.0f} MB kept (at most {self.max_count} "
                f"and {self.max_bytes / 1e6:.0f} MB), for groups that wait for the pool's verdict or audits"
            )
            return None
        tmp = self.root / f".tmp-{digest}{SUFFIX}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp))
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            _fsync_dir(self.root)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self._give_up(f"the disk could not take the file ({type(exc).__name__}: {str(exc)[:200]}; a full disk?)")
            return None
        if self._failing:
            self._failing = False
            log.warning("the weights are committed again: groups carry their proof")
        return Commitment(digest, path, path.stat().st_size, time.perf_counter() - started, written=True)

    def _give_up(self, why: str) -> None:
        if not self._failing:
            self._failing = True
            log.warning(
                "this round's weights are not committed: %s. Its groups are shared without a proof (unaudited: no "
                "credit, and no audit to fail) until commitments can be kept again",
                why,
            )

    def prune(self, keep: Collection[str] = ()) -> list[str]:
        """Delete the files nothing keeps (see the module docstring); returns their digests."""
        now = self._clock()
        with self._lock:
            expired = [audit for audit, (_, deadline) in self._holds.items() if deadline <= now]
            for audit in expired:
                del self._holds[audit]
            if expired:
                self._write_holds()
            held = {digest for digest, _ in self._holds.values()}
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(self.root):
                    name = entry.name
                    if name.startswith(DIFF_PREFIX) and name[len(DIFF_PREFIX) :].split(".")[0] not in self._holds:
                        Path(entry.path).unlink(missing_ok=True)
            deleted = []
            for digest, _ in self.files().items():
                path = self.root / f"{digest}{SUFFIX}"
                try:
                    age = now - path.stat().st_mtime
                except OSError:
                    continue
                if digest in held or (digest in keep and age < self.max_age):
                    continue
                path.unlink(missing_ok=True)
                deleted.append(digest)
        return deleted

    def files(self) -> dict[str, int]:
        """digest -> bytes of every file kept."""
        found = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                name = entry.name
                if name.endswith(SUFFIX) and not name.startswith(".") and len(name) == 64 + len(SUFFIX):
                    with contextlib.suppress(OSError):
                        found[name[:64]] = entry.stat().st_size
        return found

    # ------------------------------------------------------------------ the upload thread's side
    def path(self, digest: str) -> Path | None:
        """The file committed as `digest`, if the node still has it."""
        if len(digest) != proof.DIGEST_HEX_CHARS or not all(c in "0123456789abcdef" for c in digest):
            return None
        path = self.root / f"{digest}{SUFFIX}"
        return path if path.is_file() else None

    def diff(self, audit: str, digest: str) -> Path | None:
        """The file committed as `digest` as its difference from the store's base, made once per audit
        (sapo_node.weightdiff); None without a base, or when it cannot be made (the whole file is sent)."""
        path, source = self.root / f"{DIFF_PREFIX}{audit}{DIFF_SUFFIX}", self.path(digest)
        if self.base is None or source is None:
            return None
        if path.is_file():
            return path
        from safetensors.torch import load_file

        from sapo_node import weightdiff

        tmp = path.with_name(f"{DIFF_PREFIX}{audit}.tmp{DIFF_SUFFIX}")
        try:
            base_digest, base = base_tensors(self.base, cache_dir=self.base_cache)
            weightdiff.write_diff(
                tmp, load_file(str(source)), base, model=self.base, base_digest=base_digest, weights=digest
            )
            os.replace(tmp, path)
        except Exception as exc:  # noqa: BLE001 - the whole file is the answer to anything that goes wrong here
            tmp.unlink(missing_ok=True)
            log.warning(
                "audit %s: no difference from the %s base (%s); the whole checkpoint is sent", audit, self.base, exc
            )
            return None
        return path

    def hold(self, audit: str, digest: str, deadline: float) -> bool:
        """Keep `digest`'s file for `audit` until `deadline` (unix seconds) or `release`; False when the
        node no longer has the file."""
        with self._lock:
            if self.path(digest) is None:
                return False
            if self._holds.get(audit) != (digest, float(deadline)):
                self._holds[audit] = (digest, float(deadline))
                self._write_holds()
            return True

    def release(self, audit: str) -> None:
        """The audit's upload finished (or the server no longer wants it): its file goes at the next
        prune unless something else keeps it."""
        with self._lock:
            if self._holds.pop(audit, None) is not None:
                self._write_holds()
            (self.root / f"{DIFF_PREFIX}{audit}{DIFF_SUFFIX}").unlink(missing_ok=True)

    def holds(self) -> dict[str, tuple[str, float]]:
        with self._lock:
            return dict(self._holds)

    def _read_holds(self) -> dict[str, tuple[str, float]]:
        try:
            raw = json.loads((self.root / HOLDS).read_text())
            return {str(a): (str(d), float(t)) for a, (d, t) in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("%s is unreadable (%s): the audits it held are forgotten", self.root / HOLDS, exc)
            return {}

    def _write_holds(self) -> None:
        """Caller holds the lock."""
        tmp = self.root / f".tmp-{HOLDS}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({a: [d, t] for a, (d, t) in self._holds.items()}))
            os.replace(tmp, self.root / HOLDS)
        except OSError as exc:  # kept in memory: the welcome repeats a requested audit anyway
            log.warning("%s not written (%s)", self.root / HOLDS, exc)
