"""What checking proofs of work costs the server per group (sockets.messages' proof validation and
pool.challenges.proofs_check), against a share's whole cost.

    .venv/bin/python bench/challenges.py                 # 4 nodes x 24 shares of 32 groups x 8 completions
    .venv/bin/python bench/challenges.py --tokens 512    # longer completions' proofs

Shares of real basic_arithmetic groups answering the questions of a challenge minted for their node,
each completion ~300 characters with a proof of `--tokens` token ids and log-probabilities, one
weights digest per share (a node's round). Timed in
this thread (time.thread_time; the PostgreSQL backend's CPU of the one lookup per batch is not in it):
- parse: parse_frame of each share with its proofs, and of the same share without them;
- check: proofs_check of each share's groups against the pool as filled so far (the challenge's MAC and
  questions read once per challenge and cached: the first share of a challenge pays them, `cold`);
- share: rollout_share of each share (verify, screen, store), with its proofs, for scale.
Prints microseconds per group (medians over the shares) with the load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from types import SimpleNamespace

from benchkit import load, pool_bench


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--shares", type=int, default=24, help="shares per node")
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per completion in each proof")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    bench_pool = pool_bench()
    name = "sapo_bench_challenges"
    bench_pool.recreate_database(args.database_url, name)
    try:
        os.environ.update(SAPO_DEBUG="0", SAPO_LOG_LEVEL="WARNING")
        os.environ.pop("REDIS_URL", None)
        bench_pool.setup_django(
            SimpleNamespace(bench_url=bench_pool.with_db(args.database_url, name), catalogue="sapo")
        )
        run(args, bench_pool)
    finally:
        from django.db import connections

        connections.close_all()
        bench_pool.recreate_database(args.database_url, name, drop_only=True)


def _share(node_id: int, args: argparse.Namespace, challenge: str, first: int, with_proof: bool) -> str:
    from sapo_node import proof
    from sapo_node.ids import uuid7

    weights = hashlib.sha256(f"{node_id}/{first}".encode()).hexdigest()  # one digest per node and round
    from sapo_node.tasks import CATALOGUES, build_entry, score_completion

    spec = CATALOGUES["sapo"].get("basic_arithmetic")
    seed = proof.task_seed(challenge)
    groups = []
    for j in range(first, first + args.groups):
        index = proof.task_index(challenge, j)
        entry = build_entry(spec, seed, index)
        filler = "Let me work through this step by step and check each part. " * 5
        completions = [
            f"{filler}<answer>{entry['answer'] if k % 2 else 'no'}</answer>" for k in range(args.completions)
        ]
        group = {
            "id": str(uuid7()),
            "round": 1,
            "task": {"dataset": "basic_arithmetic", "seed": seed, "index": index},
            "question": entry["question"],
            "answer": entry["answer"],
            "completions": completions,
            "rewards": [score_completion(spec, seed, entry, c) for c in completions],
        }
        if with_proof:
            group["proof"] = {
                "challenge": challenge,
                "weights": weights,
                "model": "tiny-mini",
                "temperature": 1.0,
                "tokens": [proof.encode_ids(range(k, k + args.tokens)) for k in range(args.completions)],
                "logprobs": [proof.encode_floats([-0.5] * args.tokens) for _ in range(args.completions)],
            }
        groups.append(group)
    return json.dumps({"type": "share", "v": 1, "rollouts": groups})


def run(args: argparse.Namespace, bench_pool) -> None:  # noqa: ANN001
    from pool import challenges
    from pool.ingest import rollout_share
    from pool.ingest_statement import SwarmOfBatch
    from pool.limits import current_limits
    from pool.models import Rollout
    from pool.verification import verify_rollout
    from sockets.messages import parse_frame
    from swarms.selectors import swarm_place
    from swarms.services import swarm_default_ensure

    limits, place = current_limits(), swarm_place(swarm=swarm_default_ensure())
    catalogue, in_swarm = place.catalogue, SwarmOfBatch(place.swarm_id, place.catalogue_version)
    nodes = [node for node, _ in bench_pool.make_nodes(args.nodes, "proof")]
    per_challenge = 64 // args.groups  # a challenge names 64 questions
    parse_plain, parse_proof, check_cold, check_warm, whole = [], [], [], [], []
    for s in range(args.shares):
        for node in nodes:
            if s % per_challenge == 0:
                challenge = challenges.challenge_mint(node.id)
                node.bench_challenge = challenge
            challenge = node.bench_challenge
            first = (s % per_challenge) * args.groups
            plain = _share(node.id, args, challenge, first, with_proof=False)
            proved = _share(node.id, args, challenge, first, with_proof=True)
            t0 = time.thread_time()
            parse_frame(plain, limits)
            t1 = time.thread_time()
            share = parse_frame(proved, limits)
            t2 = time.thread_time()
            parse_plain.append((t1 - t0) / args.groups)
            parse_proof.append((t2 - t1) / args.groups)
            checks = {r.id: verify_rollout(r, catalogue) for r in share.rollouts}
            t3 = time.thread_time()
            states = challenges.proofs_check([(node, share.rollouts, checks)])
            t4 = time.thread_time()
            (check_cold if s % per_challenge == 0 else check_warm).append((t4 - t3) / args.groups)
            assert all(state == challenges.PENDING for state in states[0].values()), states
            t5 = time.thread_time()
            rollout_share(node=node, rollouts=share.rollouts, catalogue=catalogue, limits=limits, swarm=in_swarm)
            whole.append((time.thread_time() - t5) / args.groups)
    pending = Rollout.objects.filter(audit_state="pending").count()
    us = 1e6

    def median(values: list[float]) -> str:
        return f"{statistics.median(values) * us:8.1f}" if values else "     n/a"

    print(
        f"{len(whole)} shares of {args.groups} groups x {args.completions} completions, "
        f"{args.tokens} tokens each; {pending} pending groups stored; load {load()}"
    )
    print(f"parse, without proofs      {median(parse_plain)} us/group")
    print(f"parse, with proofs         {median(parse_proof)} us/group")
    extra = statistics.median(parse_proof) - statistics.median(parse_plain)
    print(f"  the proofs' part         {extra * us:8.1f} us/group")
    print(f"proofs_check, cold         {median(check_cold)} us/group (a challenge's first share)")
    print(f"proofs_check, warm         {median(check_warm)} us/group")
    print(f"rollout_share, with proofs {median(whole)} us/group")
    share_cost = statistics.median(whole) + statistics.median(parse_proof)
    proof_cost = extra + statistics.median(check_warm + check_cold)
    print(f"proofs' share of a share's server CPU: {proof_cost / share_cost:.1%}; load {load()}")


if __name__ == "__main__":
    main()
