"""A checkpoint's upload, chunk by chunk (docs/audits.md, "Upload"): `PUT
/api/v1/audits/<id>/checkpoint` with the node's token, `Content-Range: bytes a-b/total`, chunks in
order, at most MAX_CHUNK_BYTES each and SAPO_AUDIT_MAX_CHECKPOINT_BYTES in all, the last one with
`X-Checkpoint-Sha256`. The file grows in a private folder under SAPO_VAR_DIR; its sha256 is checked
when the last chunk is in, before anything parses it, and the audit is then queued. The file is a
safetensors checkpoint or its difference from the model's base (sapo_node.weightdiff), whose header is
checked here too.

Every refusal is an ApplicationError with a stable code (the view answers `{"code", "detail"}`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts import limits
from audits.jobs import audit_enqueue_on_commit
from audits.models import Audit, AuditState
from audits.selectors import audit_base_known
from common.errors import ApplicationError, NotFound
from nodes.models import Node, NodeToken
from nodes.services import token_hash, token_is_well_formed
from sapo_node import weightdiff
from sapo_node.proof import file_sha256

#: The largest chunk one request may carry.
MAX_CHUNK_BYTES = 8 * 1024 * 1024
READ_BYTES = 1 << 20
#: A checkpoint sent as a difference from its model's base is kept under this suffix.
DIFF_SUFFIX = ".sapodiff"
#: The endpoint's path (audits.urls under /api/v1/), for the servers' check before any body is read.
UPLOAD_PATH = re.compile(r"/api/v1/audits/[^/]+/checkpoint")
_RANGE = re.compile(r"bytes (\d{1,15})-(\d{1,15})/(\d{1,15})")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ChunkRange:
    first: int
    last: int
    total: int

    @property
    def length(self) -> int:
        return self.last - self.first + 1


def node_of_token(authorization: str | None) -> Node:
    """The node whose active token the `Authorization: Bearer` header carries; 401 otherwise."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token_is_well_formed(token):
        raise ApplicationError("unauthenticated", "Send the node's token as 'Authorization: Bearer <token>'.", 401)
    row = NodeToken.objects.select_related("node").filter(token_hash=token_hash(token), revoked_at=None).first()
    if row is None or row.node.banned_at is not None or row.node.retired_at is not None:
        raise ApplicationError("unauthenticated", "This token is not a valid node token.", 401)
    return row.node


def parse_range(header: str | None, *, max_total: int) -> ChunkRange:
    match = _RANGE.fullmatch((header or "").strip())
    if match is None:
        raise ApplicationError("bad_range", "Send 'Content-Range: bytes <first>-<last>/<total>'.")
    first, last, total = (int(g) for g in match.groups())
    if not first <= last < total:
        raise ApplicationError("bad_range", f"The range {first}-{last}/{total} is not inside the file.")
    if total > max_total:
        raise ApplicationError(
            "checkpoint_too_large", f"A checkpoint is at most {max_total} bytes; this one is {total}.", 413
        )
    if last - first + 1 > MAX_CHUNK_BYTES:
        raise ApplicationError("chunk_too_large", f"A chunk is at most {MAX_CHUNK_BYTES} bytes.", 413)
    return ChunkRange(first, last, total)


def body_refused(method: str, path: str, headers: Mapping[str, str]) -> ApplicationError | None:
    """The refusal of an upload request whose body must not be read at all, from its headers (names in
    lower case): no Content-Length (a chunked body, whose length nobody knows before reading it), one
    that is not a number, one past MAX_CHUNK_BYTES, or one that is not its Content-Range's length. The
    server checks it before reading a byte of the body (config.asgi: daphne's HTTP layer and the ASGI
    application both); None for any other request, and for what the view checks itself."""
    if method != "PUT" or not UPLOAD_PATH.fullmatch(path):
        return None
    length = headers.get("content-length")
    if length is None:
        return ApplicationError("length_required", "Send the chunk with its Content-Length.", 411)
    if not length.isdigit() or len(length) > 15:
        return ApplicationError("bad_length", "Content-Length must be the chunk's length, as Content-Range says.")
    if int(length) > MAX_CHUNK_BYTES:
        return ApplicationError("chunk_too_large", f"A chunk is at most {MAX_CHUNK_BYTES} bytes.", 413)
    announced = _RANGE.fullmatch(headers.get("content-range", "").strip())
    if announced is not None and int(announced[2]) - int(announced[1]) + 1 != int(length):
        return ApplicationError("bad_length", "Content-Length must be the chunk's length, as Content-Range says.")
    return None


def upload_dir() -> Path:
    """The uploads' folder, readable by the site's user only."""
    path = Path(settings.SAPO_AUDIT_UPLOAD_DIR)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def chunk_receive(
    *,
    audit_id: str,
    authorization: str | None,
    content_range: str | None,
    content_length: str | None,
    sha256: str | None,
    read: Callable[[int], bytes],
) -> dict[str, object]:
    """Store one chunk of an audit's checkpoint; returns what the node is told (`received`, `total`,
    `state`). `read(n)` reads the request body."""
    node = node_of_token(authorization)
    limits.consume(
        "audit-chunk",
        str(node.id),
        limit=settings.SAPO_AUDIT_CHUNKS_PER_MINUTE,
        window=60,
        what="checkpoint chunks per minute for this node",
    )
    try:
        audit_uuid = uuid.UUID(audit_id)
    except ValueError:
        raise NotFound("No such audit.") from None
    chunk = parse_range(content_range, max_total=settings.SAPO_AUDIT_MAX_CHECKPOINT_BYTES)
    if content_length is None or not content_length.isdigit() or int(content_length) != chunk.length:
        raise ApplicationError("bad_length", "Content-Length must be the chunk's length, as Content-Range says.")
    if chunk.last + 1 == chunk.total and (sha256 is None or not _SHA256.fullmatch(sha256.strip().lower())):
        raise ApplicationError("missing_sha256", "The last chunk carries 'X-Checkpoint-Sha256: <64 hex>'.")
    with transaction.atomic():
        audit = Audit.objects.select_for_update().filter(id=audit_uuid, node=node).first()
        if audit is None:  # another node's audit answers the same: its existence is not this node's to learn
            raise NotFound("No such audit.")
        _check_open(audit, chunk)
        path = upload_dir() / f"{audit.id}.safetensors"
        part = Path(str(path) + ".part")
        _write(part, chunk, read)
        audit.upload_path, audit.upload_total = str(path), chunk.total
        audit.upload_size = chunk.last + 1
        if audit.upload_size < chunk.total:
            audit.save(update_fields=["upload_path", "upload_total", "upload_size"])
            return {"state": audit.state, "received": audit.upload_size, "total": chunk.total}
        expected = sha256.strip().lower()  # type: ignore[union-attr]: checked above
        refused = None
        if file_sha256(part) != expected:
            refused = ApplicationError(
                "hash_mismatch", "The file's sha256 is not the one announced: upload it again from byte 0.", 422
            )
        elif weightdiff.is_diff(part):
            refused = _diff_refused(part, audit)
            path = path.with_suffix(DIFF_SUFFIX)
        if refused is not None:  # the node starts again from byte 0 (the deadline bounds retries)
            part.unlink(missing_ok=True)
            audit.upload_size, audit.upload_total = 0, None
            audit.save(update_fields=["upload_path", "upload_total", "upload_size"])
        else:
            os.replace(part, path)
            audit.upload_path = str(path)
            audit.state, audit.upload_sha256, audit.uploaded_at = AuditState.UPLOADED, expected, timezone.now()
            audit.save(
                update_fields=["upload_path", "upload_total", "upload_size", "state", "upload_sha256", "uploaded_at"]
            )
            audit_enqueue_on_commit(audit.id)
    if refused is not None:
        raise refused
    return {"state": AuditState.UPLOADED.value, "received": chunk.total, "total": chunk.total}


def _diff_refused(part: Path, audit: Audit) -> ApplicationError | None:
    """Why a checkpoint sent as a difference (sapo_node.weightdiff) is refused before it is queued: a
    malformed header, another model's, a base no worker of this site holds (the node then sends the
    whole checkpoint), or weights past the size bound once reconstructed. The worker checks the rest."""
    try:
        with part.open("rb") as f:
            header = weightdiff.read_header(f, file_size=part.stat().st_size)
    except weightdiff.DiffError as exc:
        return ApplicationError(exc.code, f"This checkpoint difference is refused: {exc}", 422)
    if header.model != audit.model:
        return ApplicationError("bad_diff", f"This audit is of {audit.model}, not {header.model}.", 422)
    if not audit_base_known(model=audit.model, digest=header.base):
        return ApplicationError(
            "unknown_base", "This site holds no such base weights: upload the whole checkpoint instead.", 422
        )
    if header.raw_bytes > settings.SAPO_AUDIT_MAX_CHECKPOINT_BYTES:
        return ApplicationError(
            "checkpoint_too_large",
            f"A checkpoint is at most {settings.SAPO_AUDIT_MAX_CHECKPOINT_BYTES} bytes; this one would be "
            f"{header.raw_bytes}.",
            413,
        )
    return None


def _check_open(audit: Audit, chunk: ChunkRange) -> None:
    if audit.state != AuditState.REQUESTED:
        raise ApplicationError("audit_closed", f"This audit is {audit.state}: it takes no upload.", 409)
    if audit.deadline <= timezone.now():
        raise ApplicationError("deadline_passed", "This audit's deadline has passed.", 410)
    if audit.upload_total is not None and chunk.total != audit.upload_total:
        raise ApplicationError(
            "bad_range", f"This upload's total is {audit.upload_total} bytes; restart from 0 for another file.", 409
        )
    if chunk.first != audit.upload_size and not (chunk.first == 0 and audit.upload_total is None):
        raise ApplicationError(
            "out_of_order",
            f"Chunks go in order: the next starts at byte {audit.upload_size}.",
            409,
            extra={"received": audit.upload_size},
        )


def _write(part: Path, chunk: ChunkRange, read: Callable[[int], bytes]) -> None:
    """Append the body at chunk.first (the file is cut there first); the body must be exactly the
    chunk's length."""
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, chunk.first)
        os.lseek(fd, chunk.first, os.SEEK_SET)
        left = chunk.length
        while left > 0:
            data = read(min(READ_BYTES, left))
            if not data:
                break
            os.write(fd, data)
            left -= len(data)
        extra = read(1)
        if left or extra:
            os.ftruncate(fd, chunk.first)
            raise ApplicationError("bad_length", "The body's length is not the chunk's length.")
    finally:
        os.close(fd)
