"""The checkpoint upload's bodies on a real server (daphne as deployed, and uvicorn through config.asgi's
BodyGate), over a raw socket: a request announcing more than a chunk, no length at all (a chunked
body) or a length that is not its range's is answered on its headers with a typed error before any of
its body is sent, and nothing is written; a chunk within its bounds is taken as before."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from factories import make_node_with_token
from support.audits import make_audit

from audits.models import Audit
from audits.upload import MAX_CHUNK_BYTES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TOTAL = 64 * 1024 * 1024


@pytest.fixture(params=["daphne", "uvicorn"])
def server(request, asgi_server, tmp_path, monkeypatch):
    monkeypatch.setenv("SAPO_TEST_ASGI_SERVER", request.param)
    with asgi_server(settings={"SAPO_AUDIT_UPLOAD_DIR": tmp_path / "uploads", "REDIS_URL": ""}) as live:
        yield live


def send_headers(url: str, lines: list[str]) -> socket.socket:
    address = urlsplit(url)
    sock = socket.create_connection((address.hostname, address.port), timeout=10)
    sock.sendall(("\r\n".join([*lines, "", ""])).encode())
    return sock


def answer(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the server's answer (read until the server closes)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = [int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
        if length and len(body) >= length[0]:
            break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def upload_request(audit: Audit, token: str, *extra: str) -> list[str]:
    return [
        f"PUT /api/v1/audits/{audit.id}/checkpoint HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Bearer {token}",
        f"Content-Range: bytes 0-{MAX_CHUNK_BYTES - 1}/{TOTAL}",
        *extra,
    ]


def nothing_written(audit: Audit, folder) -> bool:
    audit.refresh_from_db()
    return audit.upload_size == 0 and audit.upload_total is None and not (folder.exists() and any(folder.iterdir()))


def test_a_body_past_the_chunk_cap_is_refused_before_it_is_sent(server, tmp_path):
    node, token = make_node_with_token()
    audit = make_audit(node)
    sock = send_headers(server.url, upload_request(audit, token, f"Content-Length: {TOTAL}"))
    started = time.monotonic()
    try:
        status, body = answer(sock)  # not one byte of the 64 MiB sent
    finally:
        sock.close()
    assert (status, body["code"]) == (413, "chunk_too_large") and time.monotonic() - started < 10
    assert nothing_written(audit, tmp_path / "uploads")


def test_a_body_without_content_length_is_refused_before_it_is_read(server, tmp_path):
    node, token = make_node_with_token()
    audit = make_audit(node)
    sock = send_headers(server.url, upload_request(audit, token, "Transfer-Encoding: chunked"))
    try:
        sock.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")  # the first of many chunks
        status, body = answer(sock)
    finally:
        sock.close()
    assert (status, body["code"]) == (411, "length_required")
    assert nothing_written(audit, tmp_path / "uploads")


def test_a_content_length_that_is_not_the_ranges_is_refused_before_the_body_is_sent(server, tmp_path):
    node, token = make_node_with_token()
    audit = make_audit(node)
    sock = send_headers(server.url, upload_request(audit, token, "Content-Length: 4096"))  # the range says 8 MiB
    try:
        status, body = answer(sock)
    finally:
        sock.close()
    assert (status, body["code"]) == (400, "bad_length")
    assert nothing_written(audit, tmp_path / "uploads")


def test_a_chunk_within_its_bounds_is_still_taken(server, tmp_path):
    node, token = make_node_with_token()
    audit = make_audit(node)
    lines = upload_request(audit, token, "Content-Length: 4096")
    lines[3] = f"Content-Range: bytes 0-4095/{TOTAL}"
    sock = send_headers(server.url, lines)
    try:
        sock.sendall(b"x" * 4096)
        status, body = answer(sock)
    finally:
        sock.close()
    assert (status, body) == (200, {"state": "requested", "received": 4096, "total": TOTAL})
