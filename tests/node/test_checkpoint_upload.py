"""The node's side of an audit's upload (sapo_node.transport.upload), as a transport check against a
plain HTTP server in the test: the committed file goes in ordered chunks with the token, Content-Range
and, on the last, the file's sha256; failures are retried until the deadline, a refusal is not, and
weights the node no longer keeps are answered by nothing. The platform's own endpoint is exercised by
the live tests (tests/integration)."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from sapo_node import weightdiff
from sapo_node.commitments import CommitmentStore
from sapo_node.transport.upload import CheckpointUploader, http_base, parse_audits


class Receiver(ThreadingHTTPServer):
    """Records every PUT; answers `script` statuses first (one per request), then 204."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.puts: list[tuple[str, dict[str, str], bytes]] = []
        self.refused: list[bytes] = []
        self.script: list[int | tuple[int, str]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def body(self) -> bytes:
        """The file as the server would assemble it: each chunk at its Content-Range."""
        data = bytearray()
        for _, headers, chunk in self.puts:
            start = int(headers["Content-Range"].split()[1].split("-")[0])
            data[start : start + len(chunk)] = chunk
        return bytes(data)


class Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        status = self.server.script.pop(0) if self.server.script else 204
        answer = b""
        if isinstance(status, tuple):  # (status, the refusal's code)
            status, answer = status[0], json.dumps({"code": status[1]}).encode()
        if status == 204:
            self.server.puts.append((self.path, dict(self.headers), body))
        else:
            self.server.refused.append(body)
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.shutdown()


@pytest.fixture
def committed(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.Linear(40, 8))
    store = CommitmentStore(tmp_path / "commitments")
    return store, store.commit(model)


def audit(digest: str, deadline: float | None = None) -> dict:
    id_ = str(uuid.uuid4())
    return {
        "id": id_,
        "weights": digest,
        "upload": f"/api/v1/audits/{id_}/checkpoint",
        "deadline": int(deadline or time.time() + 600),
    }


def wait_until(condition, timeout=10.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_the_committed_file_goes_in_ordered_chunks_with_its_sha256_and_is_released(receiver, committed):
    store, c = committed
    uploader = CheckpointUploader(receiver.base, "tok", store, chunk_bytes=1000)
    entry = audit(c.digest)
    uploader.request(parse_audits([entry]))
    wait_until(lambda: uploader.uploaded == [entry["id"]])
    uploader.close()

    data = c.path.read_bytes()
    assert receiver.body() == data and len(receiver.puts) == -(-len(data) // 1000)
    ranges = [h["Content-Range"] for _, h, _ in receiver.puts]
    assert ranges[0] == f"bytes 0-999/{len(data)}" and ranges[-1].endswith(f"-{len(data) - 1}/{len(data)}")
    assert all(path == entry["upload"] and h["Authorization"] == "Bearer tok" for path, h, _ in receiver.puts)
    assert [h.get("X-Checkpoint-Sha256") for _, h, _ in receiver.puts] == [None] * (len(receiver.puts) - 1) + [
        hashlib.sha256(data).hexdigest()
    ]
    assert store.holds() == {} and store.prune(keep=set()) == [c.digest]


def test_a_model_with_a_base_sends_its_difference_and_the_whole_file_when_the_server_refuses_it(
    receiver, tmp_path, tiny_mini_policy, tiny_cache_dir
):
    model = copy.deepcopy(tiny_mini_policy[0])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape) * 1e-5)
    store = CommitmentStore(tmp_path / "commitments", base="tiny-mini", base_cache=tiny_cache_dir)
    c = store.commit(model)
    first, second = audit(c.digest), audit(c.digest)
    uploader = CheckpointUploader(receiver.base, "tok", store)
    uploader.request(parse_audits([first]))
    wait_until(lambda: uploader.uploaded == [first["id"]], timeout=60)
    sent = receiver.body()
    assert sent.startswith(weightdiff.MAGIC) and len(sent) < 0.75 * c.bytes
    assert receiver.puts[-1][1]["X-Checkpoint-Sha256"] == hashlib.sha256(sent).hexdigest()

    receiver.puts.clear()
    receiver.script = [(422, "unknown_base")]  # a site no worker of which has built tiny-mini yet
    uploader.request(parse_audits([second]))
    wait_until(lambda: uploader.uploaded == [first["id"], second["id"]], timeout=60)
    uploader.close()
    assert receiver.refused[0].startswith(weightdiff.MAGIC) and receiver.body() == c.path.read_bytes()
    store.prune(keep=set())
    assert sorted(p.name for p in (tmp_path / "commitments").iterdir()) == ["holds.json"]


def test_a_failed_chunk_is_retried_and_a_refusal_is_not(receiver, committed):
    store, c = committed
    uploader = CheckpointUploader(receiver.base, "tok", store, chunk_bytes=4000, retry_min=0.01)
    receiver.script = [204, 503]  # the second chunk fails once: the upload starts again
    entry = audit(c.digest)
    uploader.request(parse_audits([entry]))
    wait_until(lambda: uploader.uploaded == [entry["id"]])
    assert receiver.body() == c.path.read_bytes()

    receiver.puts.clear()
    receiver.script = [404]
    refused = audit(c.digest)
    uploader.request(parse_audits([refused]))
    wait_until(lambda: uploader.given_up == [refused["id"]])
    uploader.close()
    assert receiver.puts == [] and store.holds() == {}


def test_an_upload_that_keeps_failing_stops_at_the_deadline(receiver, committed):
    store, c = committed
    uploader = CheckpointUploader(receiver.base, "tok", store, retry_min=0.05)
    receiver.script = [503] * 1000
    entry = audit(c.digest, deadline=time.time() + 1.5)
    uploader.request(parse_audits([entry]))
    wait_until(lambda: uploader.given_up == [entry["id"]])
    uploader.close()
    assert receiver.puts == [] and store.holds() == {}


def test_weights_the_node_no_longer_keeps_are_answered_by_nothing_and_logged_once(receiver, committed, caplog):
    store, c = committed
    uploader = CheckpointUploader(receiver.base, "tok", store)
    entry = audit("ab" * 32)
    with caplog.at_level(logging.WARNING, logger="sapo_node.transport"):
        uploader.request(parse_audits([entry]))
        uploader.request(parse_audits([entry]))  # the next welcome repeats it
    uploader.close()
    assert receiver.puts == [] and sum("no longer keeps" in r.message for r in caplog.records) == 1


def test_malformed_audit_entries_are_skipped():
    good = audit("ab" * 32)
    bad = [
        dict(good, weights="AB" * 32),
        dict(good, weights="../x"),
        dict(good, upload="https://elsewhere.example/steal"),
        dict(good, upload="//elsewhere.example/steal"),
        dict(good, id="not-a-uuid"),
        dict(good, deadline="soon"),
        "text",
    ]
    assert [a.id for a in parse_audits([*bad, good])] == [good["id"]]
    assert parse_audits({"not": "a list"}) == []
    assert http_base("wss://sapo.example.org/ws/node/") == "https://sapo.example.org"
    assert http_base("ws://127.0.0.1:8000/ws/node/") == "http://127.0.0.1:8000"
