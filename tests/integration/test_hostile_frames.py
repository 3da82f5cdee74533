"""The node WebSocket under attack, over a real socket: daphne running the pool consumer,
PostgreSQL, Redis when REDIS_URL is set.

- 2,000 fuzzed frames from a fixed seed (bench/fuzz.py makes them; `python bench/fuzz.py` runs
  10,000): every frame answered once, with its ref when it had a readable one; no traceback in the
  server's log; no close at all (1011 or other); no forged or stolen group stored as accepted, no
  credit claimed; an honest share afterwards accepted;
- frames around the size limits: a frame a little over SAPO_MAX_FRAME_BYTES is answered
  `frame_too_large` with its ref, a frame over the WebSocket layer's limit closes with 1009 (not a
  bare TCP drop), and with SAPO_MAX_FRAME_BYTES raised above daphne's 1 MiB default a 1.5 MiB frame
  reaches the consumer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from factories import make_node_with_token

from nodes.presence import connected_node_ids
from pool.limits import WEBSOCKET_HEADROOM_BYTES
from pool.models import Consumption, NodeRound, Rollout, Verdict

# Last, not first: bench/pool.py would otherwise shadow the platform's pool package for every process
# the run starts afterwards (a multiprocessing child unpickling pool.build_worker imports by this path).
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import fuzz  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

FUZZ_SETTINGS = {
    "SAPO_CATALOGUE": "easy",
    # Every frame is answered, whatever came before: no 4429 after 20 errors, no rate refusal.
    "SAPO_LIMITS": {
        "max_messages_per_minute": 10**9,
        "max_bytes_per_minute": 10**12,
        "max_cpu_ms_per_minute": 10**12,
        "max_consecutive_errors": 10**9,
    },
    "CONN_MAX_AGE": 600,  # persistent database connections, as bench/pool.py and production use
}
FRAMES = 2000
SEED = 20261122


def run(url: str, token: str, frames: list[fuzz.Frame], max_bytes: int) -> fuzz.FuzzResult:
    return asyncio.run(fuzz.run_fuzz(url, token, frames, max_bytes=max_bytes))


def test_2000_fuzzed_frames_are_all_answered_and_nothing_forged_lands(asgi_server, tmp_path):
    from pool.limits import current_limits

    attacker, attacker_token = make_node_with_token(name="attacker")
    owner, owner_token = make_node_with_token(name="honest")
    log_path = tmp_path / "server.log"
    max_bytes = current_limits().websocket_max_bytes  # the defaults: FUZZ_SETTINGS leaves the sizes alone
    with asgi_server(settings=FUZZ_SETTINGS, log_path=log_path) as server:
        url = server.ws_url + "/ws/node/"
        before = run(url, owner_token, [fuzz.other_nodes_frame(SEED)], max_bytes)
        assert before.accepted_ids == set(fuzz.STOLEN_IDS)
        frames = fuzz.hostile_frames(SEED, FRAMES, fuzz.honest_groups(64, seed=SEED))
        assert len({f.kind for f in frames}) > 20  # the mix really is mixed
        started = time.monotonic()
        result = run(url, attacker_token, frames, max_bytes)
        print(f"\n{fuzz.figures(result)}\n({time.monotonic() - started:.1f} s)")
        after = run(url, attacker_token, [fuzz.honest_frame(SEED + 1)], max_bytes)
        deadline = time.monotonic() + 10  # every socket the attacker opened is counted out
        while attacker.id in connected_node_ids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert attacker.id not in connected_node_ids()

    assert result.unanswered == [] and result.bad_replies == []
    assert result.answered == FRAMES
    assert result.ref_mismatches == []
    assert result.close_codes == []
    log = log_path.read_text()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    # Every kind of refusal happened, and some frames went through.
    for code in ("invalid_json", "invalid_message", "unsupported_version", "unknown_type", "ack", "samples"):
        assert result.codes[code] > 0, result.codes
    # Nothing forged landed: every accepted group verifies again, stolen ids stay their owner's,
    # nobody was credited for groups the attacker was never served.
    assert fuzz.forged_rows("easy") == []
    assert set(Rollout.objects.filter(id__in=fuzz.STOLEN_IDS).values_list("node_id", flat=True)) == {owner.id}
    assert Consumption.objects.count() == 0
    assert set(Rollout.objects.filter(node=attacker, verdict=Verdict.REJECTED).values_list("reason", flat=True)) >= {
        "reward_mismatch",
        "answer_mismatch",
        "question_mismatch",
        "unknown_task",
        "bad_index",
    }
    for figures in NodeRound.objects.values_list("figures", flat=True):
        assert all(v is None or isinstance(v, int | float) and abs(v) < 1e300 for v in figures.values())
    # The attacker is still a node like any other: its honest share after the attack is accepted.
    assert after.codes == {"ack": 1} and len(after.accepted_ids) == 1


def test_frames_around_the_size_limits(asgi_server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    _, token = make_node_with_token(name="big-frames")
    limit = 2 * 1024 * 1024  # above daphne's own 1 MiB default
    settings = {"SAPO_LIMITS": {"max_frame_bytes": limit}}

    def hello(size: int, ref: str) -> str:
        frame = {"type": "hello", "v": 1, "ref": ref, "client": ""}
        return json.dumps(frame).replace('"client": ""', '"client": "' + "x" * (size - len(json.dumps(frame))) + '"')

    with asgi_server(settings=settings) as server:
        url = server.ws_url + "/ws/node/"
        headers = {"Authorization": f"Bearer {token}"}
        with connect(url, additional_headers=headers, max_size=None, open_timeout=30) as ws:
            for size, ref, code in [
                (1_500_000, "a", "invalid_message"),  # within the limit: the consumer reads it (client too long)
                (limit + 1000, "b", "frame_too_large"),  # a little over: answered, with the ref
            ]:
                ws.send(hello(size, ref))
                reply = json.loads(ws.recv(timeout=30))
                assert (reply["type"], reply["code"], reply["ref"]) == ("error", code, ref)
            ws.send(hello(limit + WEBSOCKET_HEADROOM_BYTES + 1, "c"))  # over the WebSocket layer's limit
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            assert ws.close_code == 1009


def test_a_text_message_that_is_not_utf8_closes_with_1007_and_the_server_goes_on(asgi_server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    _, token = make_node_with_token(name="bad-bytes")
    with asgi_server() as server:
        url, headers = server.ws_url + "/ws/node/", {"Authorization": f"Bearer {token}"}
        with connect(url, additional_headers=headers, open_timeout=30) as ws:
            ws.send(b'{"type": "hello", "v": 1, "client": "\xff\xfe"}', text=True)  # a text frame, not UTF-8
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=30)
            assert ws.close_code == 1007
        with connect(url, additional_headers=headers, open_timeout=30) as ws:  # the next socket is served
            ws.send(json.dumps({"type": "hello", "v": 1, "client": "ok", "model": "m", "hardware": "h"}))
            assert json.loads(ws.recv(timeout=30))["type"] == "welcome"
