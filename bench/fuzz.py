"""Protocol fuzzing of the node WebSocket: hostile and mutated frames over a real socket.

    .venv/bin/python bench/fuzz.py                    # 10,000 frames (seed 9): figures and load average
    .venv/bin/python bench/fuzz.py --frames 2000 --seed 1

A daphne server (a subprocess, its log captured) on a loopback port, one node, and a fixed-seed stream
of frames: valid frames mutated (a field replaced by a hostile value, a key dropped or added, the text
cut or spliced), deep nesting, huge integers, NaN/Infinity, NUL and lone surrogates, wrong types,
binary frames, forged groups and credit claims. Every frame must get exactly one reply (an error, an
ack, samples or a welcome) carrying the frame's ref whenever the frame had a readable one; the server
must log no traceback and never close with 1011; no forged group may be stored as accepted; and an
honest share afterwards must be accepted. Runs in its own database (`--db-name`, dropped at the end).

tests/integration/test_hostile_frames.py imports `honest_groups`, `hostile_frames` and `run_fuzz`
from here and runs 2,000 frames against the test server (docs/benchmarks.md, "Fuzzing the node
protocol").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import ROOT, checkout_pythonpath, pool_bench, use_checkout

use_checkout()

#: Must match sockets.messages.MAX_NESTING and pool.limits.WEBSOCKET_HEADROOM_BYTES (the oracle below
#: reimplements what a readable ref is, rather than asking the code under test).
MAX_NESTING = 16
REPLY_TYPES = {"error", "ack", "samples", "welcome"}
_HOLE = "\x01hostile\x01"
_HOLE_JSON = json.dumps(_HOLE)

#: Raw JSON text put where a value was.
HOSTILE_LITERALS = [
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "1e999",
    "-1e999",
    "1E400",
    "1e-999",
    "NaN",
    "Infinity",
    "-Infinity",
    "9" * 401,
    "-" + "1" * 5000,
    "0." + "3" * 500,
    str(2**63),
    str(-(2**63) - 1),
    '""',
    json.dumps("x" * 9000),
    '"\\u0000"',
    '"a\\u0000b"',
    '"\\ud800"',
    '"\\udfff\\ud800x"',
    json.dumps("é" * 3000),
    "[]",
    "{}",
    "[" * 40 + "]" * 40,
    "[" * 10_000 + "]" * 10_000,
    '{"a":' * 3000 + "1" + "}" * 3000,
    json.dumps(list(range(5000))),
    json.dumps([[1.0] * 40] * 40),
    '"<answer>1</answer>"',
    '{"dataset": "bf"}',
    json.dumps(str(uuid.UUID(int=0))),
    json.dumps(["not-a-uuid"] * 50),
]
SPLICES = ["\x00", "{", "}", "[", "]", '"', "\\", ",", ":", "\\u0000", "\\ud800", "é", "\u2028", " ", "9" * 500]


@dataclass
class Frame:
    kind: str
    data: str | bytes


@dataclass
class FuzzResult:
    frames: int = 0
    answered: int = 0
    unanswered: list[str] = field(default_factory=list)
    bad_replies: list[str] = field(default_factory=list)
    ref_mismatches: list[str] = field(default_factory=list)
    close_codes: list[int] = field(default_factory=list)
    codes: Counter = field(default_factory=Counter)
    kinds: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    ms_by_kind: Counter = field(default_factory=Counter)  # total reply time per kind of frame
    elapsed_s: float = 0.0
    accepted_ids: set[str] = field(default_factory=set)


# --- frames ---------------------------------------------------------------------------------


def _uuid(rng: random.Random) -> str:
    """A group id as the pool takes it (a UUIDv7 of now, sapo_node.ids), its random bits from `rng`."""
    ms = int(time.time() * 1000)
    return str(uuid.UUID(int=ms << 80 | 7 << 76 | rng.getrandbits(12) << 64 | 0b10 << 62 | rng.getrandbits(62)))


def honest_groups(n: int, seed: int) -> list[dict[str, Any]]:
    """n groups as an honest node shares them (easy catalogue, right and wrong completions, real scores)."""
    from sapo_node.tasks import EASY_CATALOGUE, build_entry, score_completion

    spec = EASY_CATALOGUE.get("basic_arithmetic")
    rng = random.Random(seed)
    groups = []
    for index in range(n):
        entry = build_entry(spec, seed, index)
        completions = [f"so <answer>{entry['answer']}</answer>", "<answer>nope</answer>", "no idea"]
        groups.append(
            {
                "id": _uuid(rng),
                "round": 1,
                "task": {"dataset": spec.dataset, "seed": seed, "index": index},
                "question": entry["question"],
                "answer": entry["answer"],
                "completions": completions,
                "rewards": [score_completion(spec, seed, entry, c) for c in completions],
            }
        )
    return groups


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _paths(child, (*prefix, i))
    return out


def _set(value: Any, path: tuple, new: Any) -> None:
    for key in path[:-1]:
        value = value[key]
    value[path[-1]] = new


def _base(rng: random.Random, ref: str, groups: list[dict[str, Any]]) -> dict[str, Any]:
    kind = rng.choice(["hello", "share", "share", "sample", "report"])
    if kind == "hello":
        return {"type": "hello", "v": 1, "ref": ref, "client": "fuzz", "model": "m", "local": 4, "external": 4}
    if kind == "sample":
        return {"type": "sample", "v": 1, "ref": ref, "n": rng.randint(1, 8)}
    if kind == "report":
        used = [g["id"] for g in rng.sample(groups, 3)] + [_uuid(rng)]
        return {"type": "report", "v": 1, "ref": ref, "round": rng.randint(0, 100), "reward_mean": 0.5, "used": used}
    picked = [json.loads(json.dumps(g)) for g in rng.sample(groups, rng.randint(1, 3))]
    for g in picked:
        g["id"] = _uuid(rng)  # fresh ids: a mutation that keeps a group honest adds an honest row
    return {"type": "share", "v": 1, "ref": ref, "rollouts": picked}


def _forge(rng: random.Random, frame: dict[str, Any], groups: list[dict[str, Any]]) -> str:
    """A well-formed frame that lies: every group it carries must be rejected, every credit refused."""
    if frame["type"] != "share":
        frame.update({"type": "report", "round": 1, "used": [g["id"] for g in groups[:8]]})
        return "forged_credit"
    g = frame["rollouts"][0]
    how = rng.choice(["reward", "answer", "question", "dataset", "index", "stolen_id"])
    if how == "reward":
        g["rewards"] = [1.0 - r for r in g["rewards"]]
    elif how == "answer":
        g["answer"] = str(rng.randint(10**6, 10**7))
    elif how == "question":
        g["question"] = "What is 1 + 1?"
    elif how == "dataset":
        g["task"]["dataset"] = rng.choice(["made_up", "bf" * 32, "basic_arithmetic "])
    elif how == "index":
        g["task"]["index"] = rng.choice([-1, 2**62, 10**12])
    else:
        g["id"] = rng.choice(STOLEN_IDS)  # ids another node shared first (see other_nodes_frame)
    return "forged_" + how


#: Ids of groups another node shares before the fuzz: a frame that reuses one must get id_conflict.
#: UUIDv7s of this run's start (the pool takes ids of the last days only), numbered in their random bits.
STOLEN_IDS = [str(uuid.UUID(int=int(time.time() * 1000) << 80 | 7 << 76 | 0b10 << 62 | i)) for i in range(10)]


def other_nodes_frame(seed: int) -> Frame:
    """The share another (honest) node sends before the fuzz: groups with the STOLEN_IDS."""
    groups = honest_groups(len(STOLEN_IDS), seed=seed + 1000)
    for group, id_ in zip(groups, STOLEN_IDS, strict=True):
        group["id"] = id_
    return Frame("other_node", json.dumps({"type": "share", "v": 1, "ref": "o", "rollouts": groups}))


def honest_frame(seed: int) -> Frame:
    """One honest share, for after the attack."""
    return Frame("honest", json.dumps({"type": "share", "v": 1, "ref": "h", "rollouts": honest_groups(1, seed)}))


def hostile_frames(seed: int, count: int, groups: list[dict[str, Any]]) -> list[Frame]:
    """`count` frames from a fixed seed, each named by how it was made (see the module docstring)."""
    rng = random.Random(seed)
    frames = []
    for i in range(count):
        obj = _base(rng, f"f{i}", groups)
        base = obj["type"]
        roll = rng.random()
        if roll < 0.40:  # a value replaced by a hostile literal
            path = rng.choice(_paths(obj))
            _set(obj, path, _HOLE)
            literal = rng.choice(HOSTILE_LITERALS)
            frames.append(Frame(f"{base}:value", json.dumps(obj).replace(_HOLE_JSON, literal, 1)))
        elif roll < 0.50:  # a key dropped, or one added
            if rng.random() < 0.5:
                path = rng.choice([p for p in _paths(obj) if isinstance(p[-1], str)] or [("type",)])
                container = obj
                for key in path[:-1]:
                    container = container[key]
                container.pop(path[-1], None)
                frames.append(Frame(f"{base}:drop", json.dumps(obj)))
            else:
                name = rng.choice(["x" * 80, "type", "v", "ref", "used", "\\u0000", "figure", "rollouts"])
                text = json.dumps(obj)
                frames.append(Frame("add_key", text[:-1] + f', "{name}": {rng.choice(HOSTILE_LITERALS)}}}'))
        elif roll < 0.65:  # the text cut or spliced
            text = json.dumps(obj)
            at = rng.randint(0, len(text))
            if rng.random() < 0.3:
                frames.append(Frame("cut", text[:at]))
            else:
                end = min(len(text), at + rng.randint(0, 5))
                frames.append(Frame("splice", text[:at] + rng.choice(SPLICES) + text[end:]))
        elif roll < 0.75:  # a lie in a well-formed frame
            kind = _forge(rng, obj, groups)
            frames.append(Frame(kind, json.dumps(obj)))
        elif roll < 0.85:  # binary frames
            text = json.dumps(obj)
            choice = rng.randrange(4)
            if choice == 0:
                frames.append(Frame("binary_valid", text.encode()))
            elif choice == 1:
                frames.append(Frame("binary_utf16", text.encode("utf-16")))
            elif choice == 2:
                frames.append(Frame("binary_random", rng.randbytes(rng.randint(0, 2000))))
            else:
                raw = text.replace('"fuzz"', '"\ud800"').replace('"m"', '"\udfff"').encode("utf-8", "surrogatepass")
                frames.append(Frame("binary_surrogate", raw))
        elif roll < 0.90:  # not a message at all
            frames.append(
                Frame("junk", rng.choice(["", " ", "null", "[]", "1", '"text"', "{", "[" * 10_000, "{}" * 5000]))
            )
        else:  # valid: the socket must keep working between hostile frames
            frames.append(Frame(f"{base}:valid", json.dumps(obj)))
    return frames


# --- the oracle ----------------------------------------------------------------------------


def expected_ref(data: str | bytes, max_bytes: int) -> str | None:
    """The ref a reply must echo: the frame's, when it is a JSON object (nesting at most MAX_NESTING,
    NaN, Infinity and long numbers allowed: they are refused by field, later) with a clean string ref
    of at most 64 characters, and within what the server reads (`max_bytes`)."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return None
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        obj = json.loads(text, parse_int=lambda s: 0, parse_float=lambda s: 0.0, parse_constant=lambda s: 0.0)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or _depth(obj) > MAX_NESTING:
        return None
    ref = obj.get("ref")
    if not isinstance(ref, str) or len(ref) > 64 or "\x00" in ref:
        return None
    try:
        ref.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return ref


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return deepest


# --- running --------------------------------------------------------------------------------


async def run_fuzz(
    url: str, token: str, frames: list[Frame], *, max_bytes: int, reply_wait: float = 20.0
) -> FuzzResult:
    """Send each frame on one socket and wait for its one reply; reconnect (and count it) if closed."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    result = FuzzResult(frames=len(frames))
    headers = {"Authorization": f"Bearer {token}"}

    async def opened():
        return await connect(url, additional_headers=headers, max_size=None, ping_interval=None, open_timeout=30)

    ws = await opened()
    started = time.perf_counter()
    for frame in frames:
        result.kinds[frame.kind] += 1
        t0 = time.perf_counter()
        try:
            await ws.send(frame.data)
            raw = await asyncio.wait_for(ws.recv(), reply_wait)
        except ConnectionClosed as exc:
            result.close_codes.append(exc.rcvd.code if exc.rcvd else 1006)
            result.unanswered.append(f"{frame.kind}: connection closed")
            ws = await opened()
            continue
        except TimeoutError:
            result.unanswered.append(f"{frame.kind}: no reply in {reply_wait} s")
            continue
        result.latencies_ms.append((time.perf_counter() - t0) * 1000)
        result.ms_by_kind[frame.kind] += result.latencies_ms[-1]
        try:
            reply = json.loads(raw)
            kind = reply["type"]
        except (ValueError, TypeError, KeyError):
            result.bad_replies.append(f"{frame.kind}: {str(raw)[:200]}")
            continue
        if kind not in REPLY_TYPES:
            result.bad_replies.append(f"{frame.kind}: {str(raw)[:200]}")
            continue
        result.answered += 1
        result.codes[reply.get("code") or kind] += 1
        if reply.get("for") == "share":
            result.accepted_ids.update(reply.get("accepted") or [])
        want = expected_ref(frame.data, max_bytes)
        if reply.get("ref") != want:
            result.ref_mismatches.append(f"{frame.kind}: want {want!r}, got {str(raw)[:200]}")
    result.elapsed_s = time.perf_counter() - started
    await ws.close()
    return result


def figures(result: FuzzResult) -> str:
    """The run as a few lines of text (frames/s, latency, replies by code, the checks)."""
    lat = sorted(result.latencies_ms) or [0.0]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    lines = [
        f"frames {result.frames}, answered {result.answered}, unanswered {len(result.unanswered)}, "
        f"bad replies {len(result.bad_replies)}, ref mismatches {len(result.ref_mismatches)}, "
        f"closes {result.close_codes or 'none'}",
        f"{result.frames / result.elapsed_s:,.0f} frames/s over {result.elapsed_s:.1f} s; reply latency "
        f"p50 {statistics.median(lat):.2f} ms, p99 {p99:.2f} ms, max {lat[-1]:.1f} ms",
        "replies: " + ", ".join(f"{code} {n}" for code, n in result.codes.most_common()),
        "slowest kinds (total ms / frames): "
        + ", ".join(f"{k} {ms:,.0f}/{result.kinds[k]}" for k, ms in result.ms_by_kind.most_common(6)),
    ]
    return "\n".join(lines)


def forged_rows(catalogue_name: str) -> list[str]:
    """Accepted groups in the pool that do not verify again (must be none)."""
    from pool.models import Rollout, Verdict
    from pool.records import RolloutIn
    from pool.verification import verify_rollout
    from sapo_node.tasks import CATALOGUES

    bad = []
    for row in Rollout.objects.with_texts().filter(verdict=Verdict.ACCEPTED):
        rollout = RolloutIn(
            id=row.id,
            round=row.round,
            dataset=row.dataset,
            seed=row.seed,
            index=row.index,
            question=row.question,
            answer=row.answer,
            completions=tuple(row.completions),
            rewards=tuple(row.claimed_rewards),
        )
        check = verify_rollout(rollout, CATALOGUES[catalogue_name])
        if not check.accepted or list(check.verified_rewards or []) != row.verified_rewards:
            bad.append(str(row.id))
    return bad


# --- the benchmark --------------------------------------------------------------------------


SERVER_SCRIPT = """
import sys
import django
django.setup()
from daphne.cli import CommandLineInterface
sys.argv[0] = "daphne"
CommandLineInterface.entrypoint()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_fuzz")
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--log", default=str(ROOT / "var" / "fuzz-server.log"), help="the server's log")
    args = parser.parse_args()
    bench = pool_bench()
    args.bench_url = bench.with_db(args.database_url, args.db_name)
    args.catalogue = "easy"
    bench.recreate_database(args.database_url, args.db_name)
    log_path = Path(args.log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    server = None
    try:
        bench.setup_django(args)
        from pool.limits import current_limits

        (node, token), (other, other_token) = bench.make_nodes(2, "fuzz")
        port = bench.free_port()
        env = dict(os.environ)
        env.update(
            PYTHONPATH=checkout_pythonpath(),
            DJANGO_SETTINGS_MODULE="config.settings",
            DATABASE_URL=args.bench_url,
            SAPO_CATALOGUE="easy",
            SAPO_CONN_MAX_AGE="600",
            SAPO_MAX_MESSAGES_PER_MINUTE="100000000",
            SAPO_MAX_BYTES_PER_MINUTE=str(2**40),
            SAPO_MAX_CPU_MS_PER_MINUTE=str(2**40),
            SAPO_MAX_CONSECUTIVE_ERRORS="100000000",
            SAPO_LOG_LEVEL="WARNING",
        )
        env.pop("REDIS_URL", None)
        with log_path.open("w") as log:
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    SERVER_SCRIPT,
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-v",
                    "0",
                    "--websocket_connect_timeout",
                    "60",
                    "config.asgi:application",
                ],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _wait_listening(server, port)
        url = f"ws://127.0.0.1:{port}/ws/node/"
        max_bytes = current_limits().websocket_max_bytes
        before = asyncio.run(run_fuzz(url, other_token, [other_nodes_frame(args.seed)], max_bytes=max_bytes))
        assert len(before.accepted_ids) == len(STOLEN_IDS), before.codes
        groups = honest_groups(64, seed=args.seed)
        frames = hostile_frames(args.seed, args.frames, groups)
        load_before = os.getloadavg()
        result = asyncio.run(run_fuzz(url, token, frames, max_bytes=max_bytes))
        load_after = os.getloadavg()
        after = asyncio.run(run_fuzz(url, token, [honest_frame(args.seed + 1)], max_bytes=max_bytes))
        from pool.models import Consumption, Rollout

        forged = forged_rows("easy")
        credits = Consumption.objects.count()
        stolen = Rollout.objects.filter(id__in=STOLEN_IDS).exclude(node_id=other.id).count()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        from django.db import connections

        connections.close_all()
        bench.recreate_database(args.database_url, args.db_name, drop_only=True)
    log_text = log_path.read_text(errors="replace")
    print(f"\nProtocol fuzz: {args.frames} frames, seed {args.seed} ({os.cpu_count()} CPUs)")
    print(f"load average before {load_before[0]:.2f} / after {load_after[0]:.2f} (1 min)")
    print(figures(result))
    print("kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(result.kinds.items())))
    print(
        f"server log: {log_text.count('Traceback')} tracebacks ({log_path}); accepted groups that do not verify: "
        f"{len(forged)}; stolen ids stored: {stolen}; credit rows: {credits}; "
        f"honest share after the attack accepted: {len(after.accepted_ids) == 1}"
    )
    for problem in (result.unanswered + result.bad_replies + result.ref_mismatches)[:10]:
        print("  problem:", problem)


def _wait_listening(server: subprocess.Popen, port: int) -> None:
    import socket

    deadline = time.time() + 60
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if server.poll() is not None:
            raise SystemExit("daphne exited during start-up (see its log)")
        time.sleep(0.2)
    raise SystemExit("daphne did not start listening in 60 s")


if __name__ == "__main__":
    main()
