"""Attacks on verification: what hostile completions cost the pool, before and after the sandbox.

    .venv/bin/python bench/attack.py            # everything (a few minutes)
    .venv/bin/python bench/attack.py --smoke    # every part at tiny sizes (tests/platform/test_bench_attack.py)

(a) Payloads. Each attack payload found against the pool, scored the way the pool did before
    (reasoning-gym's `extract_answer` and `score_answer`, in a child process with a time limit and
    a 2 GiB address-space limit, so the machine survives), and the way it does now
    (`sapo_node.tasks.score_completion`, in this process).
(b) The honest path. A share's worth of honest completions (every SAPO dataset) scored in process,
    and through the sandbox's worker processes (one message per group, and one per completion),
    with the worst answer at each dataset's length cap: why catalogue datasets stay in process.
(c) Live. A daphne server (bench/pool.py's, moderation rules on) on the SAPO catalogue, one honest
    node sharing 8 groups of 8 completions at a time over a real WebSocket, and 8 attacker nodes
    sending pathological propositional_logic groups (right question, so they pass the cheap checks)
    at 10 frames/s each, the default message rate (the server's message limit is lifted so that every
    node may send it whatever its trust; the byte rate, `max_bytes_per_minute`, keeps its default, and
    the frames it refuses are counted). The honest node's share latency (send to ack) with and without
    the attackers, and with the same frames carrying a one-letter answer (the control: what the
    traffic costs when its answers are not pathological).

Every figure is printed with the load average (1 min) at the start and end of what it measures.
Runs in its own database (`--db-name`, dropped at the end) on DATABASE_URL's server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import checkout_pythonpath, load, pool_bench, use_checkout

use_checkout()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--db-name", default="sapo_bench_attack")
    parser.add_argument("--before-cpu", type=float, default=30.0, help="CPU seconds a 'before' score may take")
    parser.add_argument("--repeat", type=int, default=200, help="'after' scores timed per payload")
    parser.add_argument("--honest-groups", type=int, default=64, help="groups in the honest-path share")
    parser.add_argument("--shares", type=int, default=60, help="honest shares timed per live phase")
    parser.add_argument("--attackers", type=int, default=8)
    parser.add_argument("--attack-rate", type=float, default=10.0, help="frames/s per attacker (default rate limit)")
    parser.add_argument("--pairs", type=int, default=2, help="(quiet, attacked) pairs per attack in part (c)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check the script runs")
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--only-live", action="store_true", help="part (c) only")
    args = parser.parse_args()
    if args.smoke:
        args.before_cpu, args.repeat, args.honest_groups, args.shares, args.pairs = 1.0, 5, 9, 6, 1
    args.catalogue = "sapo"
    args.conn_max_age = 600
    return args


# --- (a) payloads -------------------------------------------------------------------------------

BEFORE_SCRIPT = """
import json, math, resource, sys, time
from reasoning_gym.utils import extract_answer
from sapo_node.tasks import CATALOGUES, build_entry, dataset_for
job = json.loads(sys.argv[1])
spec = CATALOGUES["sapo"].get(job["dataset"])
entry, ds = build_entry(spec, 1, 7), dataset_for(spec, 1)
# The time limit is on the score's CPU, not the child's start-up (importing reasoning-gym): the kernel
# stops the child (SIGXCPU) when the score has used job["cpu"] seconds; C code (9**9**9) included.
used = resource.getrusage(resource.RUSAGE_SELF)
resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(used.ru_utime + used.ru_stime + job["cpu"]), resource.RLIM_INFINITY))
print(json.dumps({"started": True}), flush=True)
cpu, wall = time.process_time(), time.perf_counter()
try:
    answer = extract_answer(job["completion"], tag_name="answer", strip=True)
    outcome = "score %.2f" % (ds.score_answer(answer, entry) if answer is not None else 0.0)
except BaseException as exc:
    outcome = type(exc).__name__
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu, "outcome": outcome}))
"""


def payloads(marker: Path) -> list[tuple[str, str, str]]:
    """(dataset, description, completion) for each attack."""
    from sapo_node.verifiers.vetted import max_answer_chars

    cap = max_answer_chars("propositional_logic")
    atoms = " ∧ ".join(f"a{i}" for i in range(40))
    return [
        (
            "binary_matrix",
            "eval that writes a file",
            f"<answer>__import__('pathlib').Path('{marker}').touch()</answer>",
        ),
        ("binary_matrix", "`9**9**9`", "<answer>9**9**9</answer>"),
        ("propositional_logic", "8,000 `¬` then `P`", "<answer>" + "¬" * 8000 + "P</answer>"),
        ("propositional_logic", f"{cap - 1} `¬` then `P` (at the cap)", "<answer>" + "¬" * (cap - 1) + "P</answer>"),
        ("propositional_logic", "40 atoms (truth table)", f"<answer>{atoms}</answer>"),
        ("basic_arithmetic", "1,000 unclosed `<answer>` (8 KB)", "<answer>" * 1000 + "x"),
    ]


def before(dataset: str, completion: str, cpu_limit: float) -> dict:
    """reasoning-gym's cost on `completion`, in a child process limited to `cpu_limit` seconds of CPU
    for the score and 2 GiB of address space."""

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    env = dict(os.environ, PYTHONPATH=checkout_pythonpath())
    job = json.dumps({"dataset": dataset, "completion": completion, "cpu": cpu_limit})
    done = subprocess.run(
        [sys.executable, "-c", BEFORE_SCRIPT, job],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=limits,
        timeout=cpu_limit * 20 + 120,  # a backstop only: the CPU limit stops the score
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if len(lines) == 2:
        return lines[1]
    if lines:  # started scoring, never finished: killed by the CPU limit (or out of memory)
        why = "CPU limit" if done.returncode == -24 else f"exit {done.returncode}"
        return {"wall": None, "cpu": None, "outcome": f"killed at {cpu_limit:g} s ({why})"}
    raise SystemExit(f"the reasoning-gym child failed to start: {done.stderr[-2000:]}")


def after(dataset: str, completion: str, repeat: int) -> tuple[float, float]:
    """(median seconds per score, score) with sapo_node's scoring."""
    from sapo_node.tasks import CATALOGUES, build_entry, score_completion

    spec = CATALOGUES["sapo"].get(dataset)
    entry = build_entry(spec, 1, 7)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        score = score_completion(spec, 1, entry, completion)
        times.append(time.perf_counter() - start)
    return statistics.median(times), score


def bench_payloads(args: argparse.Namespace) -> None:
    print("\n(a) attack payloads: before (reasoning-gym, child process) and after (sapo_node, in process)")
    print(
        "| dataset | payload | before: wall s | before: CPU s | before: outcome | ran node code | after: median µs | after: score | load start-end |"
    )
    print("|---|---|---:|---:|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for dataset, name, completion in payloads(Path(tmp) / "pwned"):
            marker = Path(tmp) / "pwned"
            l0 = load()
            b = before(dataset, completion, args.before_cpu)
            ran = "yes" if marker.exists() else "no"
            marker.unlink(missing_ok=True)
            seconds, score = after(dataset, completion, args.repeat)
            ran_after = marker.exists()
            assert not ran_after, "node code ran in sapo_node's scoring"
            wall = "-" if b["wall"] is None else f"{b['wall']:.3f}"
            cpu = "-" if b["cpu"] is None else f"{b['cpu']:.3f}"
            print(
                f"| {dataset} | {name} | {wall} | {cpu} | {b['outcome']} | {ran} | {seconds * 1e6:.1f} | {score:.2f} | {l0}-{load()} |"
            )


# --- (b) the honest path ------------------------------------------------------------------------


def honest_groups(n: int, seed: int = 11) -> list[tuple[object, int, dict, list[str]]]:
    """(spec, seed, entry, completions): n groups over the SAPO catalogue, 8 completions of ~300
    characters each, half with the right answer."""
    from sapo_node.tasks import CATALOGUES, build_entry

    pool = pool_bench()
    rng = random.Random(seed)
    catalogue = CATALOGUES["sapo"]
    groups = []
    for g in range(n):
        spec = catalogue.tasks[g % len(catalogue.tasks)]
        entry = build_entry(spec, seed, g)
        right = entry["answer"] if entry["answer"] is not None else entry["metadata"]["example_answer"]
        completions = []
        for k in range(8):
            words = " ".join(rng.choice(pool.REASONING_WORDS) for _ in range(45))[:260]
            completions.append(f"{words} <answer>{right if k % 2 == 0 else 'no idea'}</answer>")
        groups.append((spec, seed, entry, completions))
    return groups


def worst_at_cap() -> dict[str, tuple[float, str]]:
    """Per catalogue dataset: the slowest of a few worst-case answer shapes at its length cap."""
    from sapo_node.tasks import CATALOGUES, build_entry, score_completion
    from sapo_node.verifiers.vetted import max_answer_chars

    out = {}
    for spec in CATALOGUES["sapo"].tasks:
        cap = max_answer_chars(spec.dataset)
        shapes = {
            "¬…P": "¬" * (cap - 1) + "P",
            "((…P…))": "(" * ((cap - 1) // 2) + "P" + ")" * ((cap - 1) // 2),
            "P∧P∧…": ("P∧" * cap)[: cap - 1] + "P",
            "[[0,0,…]]": ("[[" + "0," * cap)[: cap - 2] + "]]",
            "[[0],[0],…]": ("[" + "[0]," * cap)[: cap - 1] + "]",
            "digits": "9" * cap,
            "\\frac": ("\\frac{" + "9" * cap)[: cap - 3] + "}{7}",
            "text": "x" * cap,
        }
        entry = build_entry(spec, 1, 7)
        slowest = (0.0, "")
        for name, answer in shapes.items():
            completion = f"<answer>{answer[:cap]}</answer>"
            times = []
            for _ in range(20):
                start = time.perf_counter()
                score_completion(spec, 1, entry, completion)
                times.append(time.perf_counter() - start)
            slowest = max(slowest, (statistics.median(times), name))
        out[spec.dataset] = slowest
    return out


def bench_honest_path(args: argparse.Namespace) -> None:
    from sapo_node.tasks import extract_answer, score_completions
    from sapo_node.verifiers.sandbox import ScoringSandbox

    groups = honest_groups(args.honest_groups)
    completions = sum(len(c) for *_, c in groups)
    rounds = 3 if args.smoke else 20

    for spec, seed, entry, texts in groups:  # warm-up: reviewed sources hashed once per dataset
        score_completions(spec, seed, entry, texts)
    l0 = load()
    start = time.perf_counter()
    for _ in range(rounds):
        for spec, seed, entry, texts in groups:
            score_completions(spec, seed, entry, texts)
    in_process = rounds * completions / (time.perf_counter() - start)
    l1 = load()

    sandbox = ScoringSandbox(workers=2)
    try:
        batched = [(spec, seed, entry, [extract_answer(t) for t in texts]) for spec, seed, entry, texts in groups]
        for spec, seed, entry, answers in batched:  # warm-up: workers forked, datasets built
            sandbox.score(spec.dataset, dict(spec.config), seed, entry, answers)
        l2 = load()
        start = time.perf_counter()
        for _ in range(rounds):
            for spec, seed, entry, answers in batched:
                sandbox.score(spec.dataset, dict(spec.config), seed, entry, answers)
        per_group = rounds * completions / (time.perf_counter() - start)
        l3 = load()
        start = time.perf_counter()
        for spec, seed, entry, answers in batched:
            for answer in answers:
                sandbox.score(spec.dataset, dict(spec.config), seed, entry, [answer])
        per_completion = completions / (time.perf_counter() - start)
        l4 = load()
    finally:
        sandbox.close()

    print(f"\n(b) the honest path: {len(groups)} groups x 8 completions of ~300 characters, every SAPO dataset")
    print("| scoring | completions/s | µs per completion | load start-end |\n|---|---:|---:|---|")
    print(f"| in process (catalogue scorers) | {in_process:,.0f} | {1e6 / in_process:.1f} | {l0}-{l1} |")
    print(f"| sandbox, 2 workers, one message per group | {per_group:,.0f} | {1e6 / per_group:.1f} | {l2}-{l3} |")
    print(
        f"| sandbox, 2 workers, one message per completion | {per_completion:,.0f} | {1e6 / per_completion:.1f} | {l3}-{l4} |"
    )

    l5 = load()
    worst = worst_at_cap()
    from sapo_node.verifiers.vetted import max_answer_chars

    print(f"\nworst answer at each dataset's length cap, median of 20 (load {l5}-{load()}):")
    print("| dataset | cap (chars) | slowest shape | µs |\n|---|---:|---|---:|")
    for dataset, (seconds, shape) in worst.items():
        print(f"| {dataset} | {max_answer_chars(dataset)} | {shape} | {seconds * 1e6:.0f} |")


# --- (c) live -----------------------------------------------------------------------------------


def honest_frames(count: int, seed: int) -> list[str]:
    from sapo_node.ids import uuid7
    from sapo_node.tasks import score_completions

    frames = []
    groups = honest_groups(count * 8, seed=seed)
    for m in range(count):
        rollouts = []
        for spec, s, entry, completions in groups[m * 8 : (m + 1) * 8]:
            rollouts.append(
                {
                    "id": str(uuid7()),
                    "round": m,
                    "task": {"dataset": spec.dataset, "seed": s, "index": entry["metadata"]["source_index"]},
                    "question": entry["question"],
                    "answer": entry["answer"],
                    "completions": completions,
                    "rewards": score_completions(spec, s, entry, completions),
                }
            )
        frames.append(json.dumps({"type": "share", "v": 1, "rollouts": rollouts}))
    return frames


ATTACK_ENDS = ["P", "Q", "(P)", "(Q)", "P∧Q", "P∨Q", "Q→P", "P↔Q"]  # 8 distinct answers, 3 characters at most


def attack_frames(count: int, seed: int, payload: str) -> list[str]:
    """One propositional_logic group per frame: the right question (anyone can rebuild it), 8
    completions of `payload` (each a little different: the pool scores a group's distinct answers
    once), and the rewards the pool's rule gives them (so it is accepted)."""
    from sapo_node.ids import uuid7
    from sapo_node.tasks import CATALOGUES, build_entry, score_completions

    spec = CATALOGUES["sapo"].get("propositional_logic")
    rng = random.Random(seed)
    frames = []
    for m in range(count):
        index = rng.randrange(10**9)
        entry = build_entry(spec, seed, index)
        completions = [payload.replace("ANSWER", end) for end in ATTACK_ENDS]
        rollout = {
            "id": str(uuid7()),
            "round": m,
            "task": {"dataset": spec.dataset, "seed": seed, "index": index},
            "question": entry["question"],
            "answer": None,
            "completions": completions,
            "rewards": score_completions(spec, seed, entry, completions),
        }
        frames.append(json.dumps({"type": "share", "v": 1, "rollouts": [rollout]}, ensure_ascii=False))
    return frames


async def live_phase(
    port: int, honest_token: str, attacker_tokens: list[str], honest: list[str], attacks, server_pid: int
) -> dict:
    import websockets

    url = f"ws://127.0.0.1:{port}/ws/node/"

    async def connect(token: str, *, attacker: bool = False):
        ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None)
        await ws.send(json.dumps({"type": "hello", "v": 1, "client": "bench-attack"}))
        reply = json.loads(await ws.recv())
        # an attacker back over its rate gets `rate_limited` even for its hello
        assert reply["type"] == "welcome" or (attacker and reply.get("code") == "rate_limited"), reply
        return ws

    stop = asyncio.Event()
    # frames answered, of them refused (error replies), and the attackers' reconnections
    sent = {"frames": 0, "errors": 0, "reconnects": 0}

    async def attacker(token: str, frames: list[str], rate: float) -> None:
        ws = await connect(token, attacker=True)
        try:
            next_at = time.perf_counter()
            for frame in frames:
                if stop.is_set():
                    break
                try:
                    await ws.send(frame)
                    reply = json.loads(await ws.recv())
                except websockets.ConnectionClosed:
                    # closed after max_consecutive_errors refusals in a row (4429): an attacker comes back
                    sent["reconnects"] += 1
                    ws = await connect(token, attacker=True)
                    continue
                sent["frames"] += 1
                sent["errors"] += reply.get("type") == "error"
                next_at += 1.0 / rate
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        finally:
            await ws.close()

    ws = await connect(honest_token)
    tasks = [asyncio.create_task(attacker(t, f, r)) for t, (f, r) in zip(attacker_tokens, attacks or [], strict=False)]
    await asyncio.sleep(1.0 if attacks else 0.0)  # let the attack reach its pace
    l0, cpu0, t0 = load(), pool_bench().process_cpu(server_pid), time.perf_counter()
    frames0, errors0, reconnects0 = sent["frames"], sent["errors"], sent["reconnects"]
    latencies = []
    for frame in honest:
        start = time.perf_counter()
        await ws.send(frame)
        reply = json.loads(await ws.recv())
        latencies.append((time.perf_counter() - start) * 1000)
        if reply.get("type") != "ack" or reply["rejected"]:
            raise SystemExit(f"honest share not accepted: {str(reply)[:300]}")
        await asyncio.sleep(0.2)
    elapsed = time.perf_counter() - t0
    cpu = pool_bench().process_cpu(server_pid) - cpu0
    attack_fps = (sent["frames"] - frames0) / elapsed
    refused_fps = (sent["errors"] - errors0) / elapsed
    reconnects = (sent["reconnects"] - reconnects0) / elapsed
    l1 = load()
    stop.set()
    await asyncio.gather(*tasks)
    await ws.close()
    latencies.sort()
    return {
        "p50": statistics.median(latencies),
        "p90": latencies[int(len(latencies) * 0.9)],
        "server_cpu": cpu / elapsed,
        "attack_fps": attack_fps,
        "refused_fps": refused_fps,
        "reconnects": reconnects,
        "errors": sent["errors"],
        "load": f"{l0}-{l1}",
    }


def bench_live(args: argparse.Namespace) -> None:
    from sapo_node.verifiers.vetted import max_answer_chars

    pool = pool_bench()
    args.bench_url = pool.with_db(args.database_url, args.db_name)
    pool.recreate_database(args.database_url, args.db_name)
    try:
        pool.setup_django(args)
        cap = max_answer_chars("propositional_logic")
        duration = args.shares * 0.25 + 5  # seconds a phase lasts, with margin
        per_attacker = int(duration * args.attack_rate) + 5
        # Each attack has its control: frames of the same size whose answer is one letter (the `¬`
        # outside the tags), so what the attack costs beyond its bytes is the difference.
        long, short = "¬" * 8000, "¬" * (cap - 3)
        attacks = [
            ("8,000 `¬` then a formula (the reported attack)", f"<answer>{long}ANSWER</answer>"),
            ("control: the same text outside the tags", f"{long} <answer>ANSWER</answer>"),
            (f"{cap - 3} `¬` then a formula (worst under the cap)", f"<answer>{short}ANSWER</answer>"),
            ("control: the same text outside the tags", f"{short} <answer>ANSWER</answer>"),
        ]
        # Fresh attacker nodes for every attacked phase: the budgets count per node, so nodes reused
        # from the phase before would start it already in debt.
        nodes = pool.make_nodes(1 + args.attackers * len(attacks) * args.pairs, "attack")
        honest_token, spare = nodes[0][1], [t for _, t in nodes[1:]]
        print(
            f"\n(c) live: 1 honest node (shares of 8 groups x 8 completions, 0.2 s apart), {args.attackers} attackers"
            f" at {args.attack_rate:g} frames/s each (one propositional_logic group of 8 pathological completions per"
            " frame); daphne with the moderation rules; ack latency of the honest shares. Every attacked phase"
            f" follows its own quiet phase (ratio within the pair), {args.pairs} pairs per attack, in rotation."
        )
        print(
            "| attack | pair | quiet p50 ms | attacked p50 ms | p50 / quiet | attacked p90 ms | attack frames/s |"
            " of them refused/s | reconnections/s | server CPU (cores) | load start-end |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        port = pool.free_port()
        server = pool.start_server(args, port, True, budgets=True)  # the default byte and CPU budgets
        ratios: dict[int, list[float]] = {a: [] for a in range(len(attacks))}
        try:
            phase = 0
            for pair in range(args.pairs):
                for a, (name, payload) in enumerate(attacks):
                    honest = honest_frames(args.shares, seed=100 + 2 * phase)
                    quiet = asyncio.run(live_phase(port, honest_token, [], honest, None, server.pid))
                    frames = [
                        (attack_frames(per_attacker, 1000 * phase + i, payload), args.attack_rate)
                        for i in range(args.attackers)
                    ]
                    tokens = spare[phase * args.attackers : (phase + 1) * args.attackers]
                    honest = honest_frames(args.shares, seed=101 + 2 * phase)
                    r = asyncio.run(live_phase(port, honest_token, tokens, honest, frames, server.pid))
                    ratios[a].append(r["p50"] / quiet["p50"])
                    print(
                        f"| {name} | {pair + 1} | {quiet['p50']:.1f} | {r['p50']:.1f} | {ratios[a][-1]:.2f} |"
                        f" {r['p90']:.1f} | {r['attack_fps']:.1f} | {r['refused_fps']:.1f} | {r['reconnects']:.2f} |"
                        f" {r['server_cpu']:.2f} | {quiet['load'].split('-')[0]}-{r['load'].split('-')[1]} |"
                    )
                    phase += 1
            print("\n| attack | median p50 / quiet over the pairs | worst pair |")
            print("|---|---:|---:|")
            for a, (name, _) in enumerate(attacks):
                print(f"| {name} | {statistics.median(ratios[a]):.2f} | {max(ratios[a]):.2f} |")
        finally:
            server.terminate()
            server.wait(timeout=10)
    finally:
        from django.db import connections

        connections.close_all()
        pool.recreate_database(args.database_url, args.db_name, drop_only=True)


def main() -> None:
    args = parse_args()
    print(f"Attack benchmark ({os.cpu_count()} CPUs), load average at start {os.getloadavg()}")
    if not args.only_live:
        bench_payloads(args)
        bench_honest_path(args)
    if not args.skip_live:
        bench_live(args)
    print(f"\nload average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
