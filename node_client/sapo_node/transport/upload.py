"""Audit uploads: the committed checkpoint the server asks for, sent from a background thread.

The server names an audit in the ack of a share (`ack.audits`) and again in every welcome while it
waits (`welcome.audits`): {id, weights, upload, deadline} (sapo_node.protocol.WireAudit). The node
holds the file committed as `weights` (sapo_node.commitments) and PUTs it to `upload`, a path on the
server the socket talks to, in chunks of at most CHUNK_BYTES, in order:
`Authorization: Bearer <token>`, `Content-Range: bytes a-b/total`, and on the last chunk
`X-Checkpoint-Sha256: <the file's sha256>` (docs/protocol.md, "Proof of work").

One audit at a time, from its own thread, so training goes on meanwhile. A failed attempt (the network,
a 5xx, 408 or 429) is retried with a doubling pause, from the offset the server says it holds (its
answer's `received`) or from the start, until the audit's deadline; then the server decides. A 4xx
other than those, a 409 that says where the server stands (`out_of_order`: the upload goes on from
there) and a 422 (the file's sha256 did not match: it starts again) means the server no longer wants
this upload (the audit finished, expired or is not this node's): the node stops. Either way the file is released to the commitments' pruning. An audit
of weights the node no longer has is answered by nothing (the deadline decides) and logged once.

A store that knows its model's base sends the checkpoint as its difference from it
(CommitmentStore.diff, sapo_node.weightdiff); a server that refuses it (`unknown_base`: no worker of
the site holds that base yet; `bad_diff`) gets the whole file, from byte 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec

from sapo_node import __version__, protocol
from sapo_node.commitments import DIFF_SUFFIX, CommitmentStore
from sapo_node.proof import file_sha256

log = logging.getLogger("sapo_node.transport")

#: Bytes per PUT: the server takes chunks of at most 8 MiB.
CHUNK_BYTES = 8 * 1024 * 1024
#: Seconds one request may take (a chunk at a slow uplink's pace, with room).
REQUEST_TIMEOUT = 120.0
#: Pauses between attempts: doubling from RETRY_MIN to RETRY_MAX, with jitter.
RETRY_MIN = 2.0
RETRY_MAX = 120.0
#: Answers after which the same request may succeed later.
RETRY_STATUSES = {408, 425, 429}
#: The server's codes for a difference it does not take (an unknown base, a format it does not read).
DIFF_REFUSALS = {"unknown_base", "bad_diff"}
#: Bounds on what the server's audit entries may hold (an upload path's length).
MAX_UPLOAD_PATH_CHARS = 512


@dataclass(frozen=True)
class AuditRequest:
    """An audit the server asked for: upload the file committed as `weights` to `upload` before `deadline`."""

    id: str
    weights: str
    upload: str
    deadline: float


def parse_audits(raw: Any) -> list[AuditRequest]:
    """The well-formed entries of an `audits` list (untrusted: the others are logged and skipped)."""
    found = []
    for item in raw if isinstance(raw, list) else []:
        try:
            wire = msgspec.convert(item, protocol.WireAudit)
        except msgspec.ValidationError as exc:
            log.warning("ignoring an audit request: %s", exc)
            continue
        parts = urlsplit(wire.upload)
        ok_path = (
            len(wire.upload) <= MAX_UPLOAD_PATH_CHARS
            and wire.upload.startswith("/")
            and not parts.scheme
            and not parts.netloc
        )
        ok_digest = len(wire.weights) == 64 and all(c in "0123456789abcdef" for c in wire.weights)
        if not (ok_path and ok_digest):
            log.warning("ignoring an audit request with a malformed weights digest or upload path")
            continue
        found.append(AuditRequest(str(wire.id), wire.weights, wire.upload, float(wire.deadline)))
    return found


def http_base(ws_url: str) -> str:
    """The site's HTTP origin for its node socket's URL: wss://host/ws/node/ -> https://host."""
    parts = urlsplit(ws_url)
    return urlunsplit(({"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme), parts.netloc, "", "", ""))


class UploadRefused(Exception):
    """The server answered a status that retrying cannot change."""


class DiffRefused(UploadRefused):
    """The server refused the checkpoint's difference from its base (DIFF_REFUSALS): send the whole file."""


class _Retry(Exception):
    """A failed attempt worth repeating, from `received` bytes on."""

    def __init__(self, message: str, received: int) -> None:
        super().__init__(message)
        self.received = received


class CheckpointUploader:
    """Uploads requested checkpoints, one at a time, from a daemon thread (`request` returns at once)."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        store: CommitmentStore,
        *,
        chunk_bytes: int = CHUNK_BYTES,
        retry_min: float = RETRY_MIN,
        retry_max: float = RETRY_MAX,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.base_url, self._token, self.store = base_url.rstrip("/"), token, store
        self.chunk_bytes, self.retry_min, self.retry_max = chunk_bytes, retry_min, retry_max
        self._clock = clock
        self._queue: queue.Queue[AuditRequest | None] = queue.Queue()
        self._known: set[str] = set()  # audit ids queued, uploaded or answered by nothing
        self._stop = threading.Event()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # as the socket: no proxy
        self._thread = threading.Thread(target=self._run, name="sapo-audit-upload", daemon=True)
        self._thread.start()
        #: Audits uploaded in full, and those given up, by id (for the log and tests).
        self.uploaded: list[str] = []
        self.given_up: list[str] = []

    def request(self, audits: list[AuditRequest]) -> None:
        """Queue the audits not seen before (the welcome repeats those still requested)."""
        for audit in audits:
            if audit.id in self._known:
                continue
            self._known.add(audit.id)
            if audit.deadline <= self._clock():
                continue
            if not self.store.hold(audit.id, audit.weights, audit.deadline):
                log.warning(
                    "the server asks to audit weights %s (audit %s), which this node no longer keeps: nothing is "
                    "uploaded, and the audit's deadline decides",
                    audit.weights[:12],
                    audit.id,
                )
                continue
            log.info("audit %s: uploading the checkpoint of weights %s", audit.id, audit.weights[:12])
            self._queue.put(audit)

    def close(self) -> None:
        """Stop after the current request (an upload cut short is retried by the next run, if the
        welcome still names it)."""
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def idle(self) -> bool:
        return self._queue.unfinished_tasks == 0

    # ------------------------------------------------------------------ the upload thread
    def _run(self) -> None:
        while not self._stop.is_set():
            audit = self._queue.get()
            try:
                if audit is not None:
                    self._until_deadline(audit)
            except Exception:  # never let the thread die silently
                log.exception("audit %s: the upload stopped", getattr(audit, "id", "?"))
            finally:
                self._queue.task_done()

    def _until_deadline(self, audit: AuditRequest) -> None:
        delay, offset, whole = self.retry_min, 0, False
        while not self._stop.is_set():
            path = self.store.path(audit.weights)
            if path is None:  # pruned meanwhile: past its deadline, or gone from the disk
                self.given_up.append(audit.id)
                return
            if not whole:
                path = self.store.diff(audit.id, audit.weights) or path
                whole = not path.name.endswith(DIFF_SUFFIX)
            try:
                self._upload(audit, path, offset)
            except DiffRefused as exc:
                log.info("audit %s: the server takes no difference (%s); sending the whole checkpoint", audit.id, exc)
                whole, offset = True, 0
                continue
            except UploadRefused as exc:
                log.warning("audit %s: the server refused the upload (%s); not retrying", audit.id, exc)
                self.given_up.append(audit.id)
                self.store.release(audit.id)
                return
            except (OSError, ValueError, _Retry) as exc:  # URLError and timeouts are OSErrors
                if self._stop.is_set():  # the node stops: the next run's welcome names the audit again
                    return
                offset = exc.received if isinstance(exc, _Retry) else 0
                pause = delay * random.uniform(0.5, 1.5)
                if self._clock() + pause >= audit.deadline:
                    log.warning("audit %s: not uploaded before its deadline (%s)", audit.id, exc)
                    self.given_up.append(audit.id)
                    self.store.release(audit.id)
                    return
                log.warning("audit %s: upload failed (%s); retrying in %.0f s", audit.id, exc, pause)
                self._stop.wait(pause)
                delay = min(delay * 2, self.retry_max)
                continue
            log.info("audit %s: checkpoint uploaded", audit.id)
            self.uploaded.append(audit.id)
            self.store.release(audit.id)
            return

    def _upload(self, audit: AuditRequest, path: Path, offset: int) -> None:
        total = path.stat().st_size
        digest = file_sha256(path)
        url = self.base_url + audit.upload
        with path.open("rb") as f:
            f.seek(offset)
            while offset < total and not self._stop.is_set():
                chunk = f.read(min(self.chunk_bytes, total - offset))
                last = offset + len(chunk) >= total
                headers = {
                    "Content-Type": "application/octet-stream",
                    "Content-Range": f"bytes {offset}-{offset + len(chunk) - 1}/{total}",
                    "User-Agent": f"sapo-node/{__version__}",
                }
                if self._token:
                    headers["Authorization"] = f"Bearer {self._token}"
                if last:
                    headers["X-Checkpoint-Sha256"] = digest
                self._put(url, chunk, headers)
                offset += len(chunk)
        if offset < total:
            raise _Retry("stopped", offset)

    def _put(self, url: str, body: bytes, headers: dict[str, str]) -> None:
        request = urllib.request.Request(url, data=body, headers=headers, method="PUT")
        try:
            with self._opener.open(request, timeout=REQUEST_TIMEOUT) as response:
                response.read(65_536)
        except urllib.error.HTTPError as exc:
            answer = _answer(exc)
            detail = _received(answer)
            if answer.get("code") in DIFF_REFUSALS:  # a difference only: the whole file may be taken
                raise DiffRefused(f"HTTP {exc.code} {answer['code']}") from exc
            if exc.code >= 500 or exc.code in RETRY_STATUSES:
                raise _Retry(f"HTTP {exc.code}", detail or 0) from exc
            if exc.code == 409 and detail is not None:  # out of order: the server says where it stands
                raise _Retry(f"HTTP {exc.code}, the server holds {detail} bytes", detail) from exc
            if exc.code == 422:  # the file arrived altered (its sha256): the server dropped it, from byte 0
                raise _Retry(f"HTTP {exc.code}", 0) from exc
            raise UploadRefused(f"HTTP {exc.code}") from exc


def _answer(exc: urllib.error.HTTPError) -> dict[str, Any]:
    """The server's JSON answer to a refused request ({} when it is not one)."""
    with contextlib.suppress(Exception):
        body = json.loads(exc.read(65_536) or b"{}")
        if isinstance(body, dict):
            return body
    return {}


def _received(answer: dict[str, Any]) -> int | None:
    """The byte count the server says it holds (`{"received": n}` in its answer), if it says one."""
    value = answer.get("received")
    return value if type(value) is int and value >= 0 else None
