"""Datasets a share makes the server build (pool.builds) and the cache of built datasets
(sapo_node.datasets): a costly dataset is measured once in a bounded worker and built only for a seed
the server issued to the node, one a share, its CPU charged to that node until its budget runs out
(`rate_limited`), its worker bounded by CPU time, not by the machine's load; the cache holds its bound
in bytes and in count."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from factories import make_node_with_token, make_user
from node_sockets import ask, open_socket
from support.pool import default_swarm, make_group, proof_of, share_frame

from pool import builds
from pool.challenges import challenge_mint
from pool.ingest import ShareIn, rollout_share_batch
from pool.limits import Limits
from sapo_node import datasets, entry_check, proof, protocol
from sapo_node.tasks import Catalogue, TaskSpec, build_entry
from sockets.heldout import heldout_check_make
from sockets.messages import parse_frame
from swarms.services import swarm_create

COSTLY = TaskSpec("count_primes", {"min_n": 1, "max_n": 5_000_000})  # a 40 MiB sieve for every seed
CHEAP = TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2})
CATALOGUE = Catalogue("t", (COSTLY, CHEAP))

# Last, not first: bench/pool.py would otherwise shadow the platform's pool package for every process
# started afterwards (a build worker gets this path).
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
from benchkit import descendants, stall_next_worker  # noqa: E402


@pytest.fixture
def fresh_cache():
    datasets.datasets_forget()
    yield
    datasets.datasets_forget()
    builds.costs_forget()  # a live server in this process measures its own (test_catalogue_live)


def _rollouts(*groups: dict):
    return parse_frame(json.dumps(share_frame(*groups)), Limits()).rollouts


def _group(spec: TaskSpec, seed: int, index: int = 3, challenge: str | None = None) -> dict:
    group = make_group(spec.dataset, catalogue=CATALOGUE, seed=seed, index=index)
    if challenge is not None:
        group["proof"] = proof_of(group, challenge)
    return group


def test_the_cache_holds_its_bound_in_bytes_and_count(fresh_cache, monkeypatch):
    spec = TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 4})
    datasets.dataset_bytes_set(spec, datasets.MAX_CACHED_BYTES // 3)
    for seed in range(5):
        build_entry(spec, seed, 1)
        assert datasets.cached_bytes() <= datasets.MAX_CACHED_BYTES
    assert [datasets.dataset_cached(spec, seed) for seed in range(5)] == [False, False, True, True, True]
    huge = TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 5})
    datasets.dataset_bytes_set(huge, datasets.MAX_CACHED_BYTES + 1)
    build_entry(huge, 1, 1)
    assert not datasets.dataset_cached(huge, 1)  # built for its use, not kept
    monkeypatch.setattr(datasets, "MAX_CACHED_DATASETS", 2)
    for seed in range(10, 14):
        build_entry(CHEAP, seed, 1)
    assert [datasets.dataset_cached(CHEAP, s) for s in range(10, 14)] == [False, False, True, True]


def _verdicts(share: builds.ShareBuilds, rollouts) -> list[str | None]:
    """Each group's verdict from `share`: its reason, "accepted", or None (verified in this process)."""
    verdicts = [share.verdict(r) for r in rollouts]
    return [None if v is None else v.reason or v.verdict for v in verdicts]


def test_a_costly_dataset_is_built_only_for_an_issued_seed_once_a_share_in_a_worker(fresh_cache, settings):
    cost = builds.build_cost(COSTLY)
    assert cost is not None and not builds.is_cheap(cost), cost  # measured in a worker
    assert builds.is_cheap(builds.build_cost(CHEAP))
    mine, again, other = challenge_mint(17), challenge_mint(17), challenge_mint(18)
    forged = _group(COSTLY, proof.task_seed(mine), index=5, challenge=mine)
    forged["answer"] = "-1"
    groups = [
        _group(COSTLY, 5),  # a seed the node chose
        _group(COSTLY, proof.task_seed(mine), challenge=mine),  # its challenge's seed: built
        _group(COSTLY, proof.task_seed(mine), index=4, challenge=mine),  # the same dataset again
        forged,  # the same dataset, verified by the worker too
        _group(COSTLY, proof.task_seed(again), challenge=again),  # a second costly build in one share
        _group(COSTLY, proof.task_seed(other), challenge=other),  # another node's challenge
        _group(CHEAP, 5),  # cheap: any seed
    ]
    datasets.datasets_forget()  # built here by make_group: the server's to build
    rollouts = _rollouts(*groups)
    share = builds.ShareBuilds(17, CATALOGUE, rollouts)
    verdicts = _verdicts(share, rollouts)
    assert verdicts == [
        "build_refused",
        "accepted",
        "accepted",
        "answer_mismatch",
        "build_refused",
        "build_refused",
        None,
    ]
    # The worker built it: this process holds nothing of it, and the share pays the worker's CPU.
    assert not datasets.dataset_cached(COSTLY, proof.task_seed(mine))
    assert share.cpu_seconds >= cost.cpu_seconds / 2, (share.cpu_seconds, cost)


@pytest.mark.parametrize("bound", ["seconds", "memory"])
def test_an_issued_seed_whose_build_passes_the_bounds_is_killed_and_refused(fresh_cache, monkeypatch, bound):
    assert not builds.is_cheap(builds.build_cost(COSTLY))  # measured within the bounds
    if bound == "seconds":  # a build of about 0.4 CPU-s, past a bound of 0.05 CPU-s
        monkeypatch.setattr(builds, "BUILD_CPU_SECONDS", 0.05)
    else:  # a 40 MiB sieve, past a bound of 8 MiB
        monkeypatch.setattr(builds, "MEMORY_BYTES", 8 * 1024 * 1024)
    challenge = challenge_mint(17)
    group = _group(COSTLY, proof.task_seed(challenge), challenge=challenge)
    datasets.datasets_forget()
    rollouts = _rollouts(group)
    share = builds.ShareBuilds(17, CATALOGUE, rollouts)
    assert _verdicts(share, rollouts) == ["build_refused"]
    assert share.cpu_seconds > 0, share.cpu_seconds  # the killed worker's CPU is the share's too
    assert not datasets.dataset_cached(COSTLY, proof.task_seed(challenge))


def test_a_build_within_its_cpu_bound_is_not_refused_on_a_loaded_machine(fresh_cache):
    """The worker's bound is CPU time: a worker a loaded machine keeps off the CPU for longer than its
    CPU bound, in the middle of a build of 0.4 CPU-s or so, still builds, and the share pays its CPU,
    not the wall clock it waited (a wall-clock bound of the same seconds refuses it: `build_refused`)."""
    assert not builds.is_cheap(builds.build_cost(COSTLY))  # measured: the fork server is up
    stall = entry_check.BUILD_CPU_SECONDS + 1.0
    challenge = challenge_mint(17)
    group = _group(COSTLY, proof.task_seed(challenge), challenge=challenge)
    datasets.datasets_forget()
    rollouts = _rollouts(group)
    share = builds.ShareBuilds(17, CATALOGUE, rollouts)
    done = threading.Event()
    with ThreadPoolExecutor(1) as staller:
        stalled = staller.submit(stall_next_worker, descendants(os.getpid()), stall, 24, done)
        started = time.monotonic()
        try:
            verdicts = _verdicts(share, rollouts)
        finally:
            done.set()
        took = time.monotonic() - started
    assert stalled.result() is not None and took > stall, (stalled.result(), took)
    assert verdicts == ["accepted"]
    assert 0 < share.cpu_seconds < stall / 2, share.cpu_seconds


def test_a_costly_dataset_whose_scorer_is_unreviewed_is_scored_in_the_sandbox(fresh_cache, monkeypatch):
    # spiral_matrix's scorer is not reviewed (tests/node/test_verifiers_sandbox.py): the build worker
    # rebuilds the entry and the sandbox's own workers score the answers, building the dataset there.
    spiral = TaskSpec("spiral_matrix", {})
    catalogue = Catalogue("t", (spiral,))
    monkeypatch.setattr(builds, "CHEAP_SECONDS", -1.0)  # every measured dataset counts as costly
    challenge = challenge_mint(17)
    seed = proof.task_seed(challenge)
    group = make_group("spiral_matrix", catalogue=catalogue, seed=seed, index=2)
    group["proof"] = proof_of(group, challenge)
    lying = make_group("spiral_matrix", catalogue=catalogue, seed=seed, index=3)
    lying["rewards"] = [1.0] * len(lying["rewards"])
    lying["proof"] = proof_of(lying, challenge)
    datasets.datasets_forget()
    rollouts = _rollouts(group, lying)
    share = builds.ShareBuilds(17, catalogue, rollouts)
    verdicts = [share.verdict(r) for r in rollouts]
    assert [v.reason or v.verdict for v in verdicts] == ["accepted", "reward_mismatch"]
    assert verdicts[0].verified_rewards == tuple(group["rewards"]) and 1.0 in group["rewards"]
    assert not datasets.dataset_cached(spiral, seed)


def test_the_measurement_is_paid_by_the_share_that_asked_for_it(fresh_cache):
    builds.costs_forget()
    rollouts = _rollouts(_group(COSTLY, 5))
    datasets.datasets_forget()
    first = builds.ShareBuilds(17, CATALOGUE, rollouts)
    assert _verdicts(first, rollouts) == ["build_refused"]  # a seed the node chose: measured, not built
    assert first.cpu_seconds > 0.1, first.cpu_seconds  # the measurement's worker: 0.4 CPU-s or so
    second = builds.ShareBuilds(18, CATALOGUE, rollouts)
    assert _verdicts(second, rollouts) == ["build_refused"]
    assert second.cpu_seconds == 0.0  # known: nothing measured again


def test_a_measurement_that_ran_out_of_time_is_tried_again_after_a_backoff(fresh_cache, monkeypatch):
    rollouts = _rollouts(_group(COSTLY, 5))
    datasets.datasets_forget()
    builds.costs_forget()
    monkeypatch.setattr(builds, "RETRY_SECONDS", 1.0)
    bound = builds.BUILD_WALL_SECONDS
    monkeypatch.setattr(builds, "BUILD_WALL_SECONDS", 0.01)  # a worker starved past its wall clock
    assert builds.build_cost(COSTLY) is None
    monkeypatch.setattr(builds, "BUILD_WALL_SECONDS", bound)
    waiting = builds.ShareBuilds(17, CATALOGUE, rollouts)
    assert _verdicts(waiting, rollouts) == ["build_refused"]
    assert waiting.cpu_seconds == 0.0  # within the backoff: refused without a worker
    time.sleep(1.1)
    cost = builds.build_cost(COSTLY)  # the backoff over: measured again, within the bound
    assert cost is not None and not builds.is_cheap(cost), cost
    # Each failure in a row doubles the backoff (here 1 s, then 2 s); a success forgets it.
    builds.costs_forget()
    monkeypatch.setattr(builds, "RETRY_SECONDS", 1.0)
    monkeypatch.setattr(builds, "BUILD_WALL_SECONDS", 0.01)
    paid = []
    for wait in (0.0, 1.2, 1.2, 1.0):  # measured, measured again (after 1 s), not yet (2 s), measured
        time.sleep(wait)
        share = builds.ShareBuilds(17, CATALOGUE, rollouts)
        assert _verdicts(share, rollouts) == ["build_refused"]
        paid.append(share.cpu_seconds > 0)
    assert paid == [True, True, False, True], paid


@pytest.mark.django_db(transaction=True)
def test_a_share_pays_for_the_dataset_it_made_the_server_build(fresh_cache):
    builds.build_cost(COSTLY)  # measured before: the figures below are the build's, not the measurement's
    (costly_node, _), (honest_node, _) = make_node_with_token(), make_node_with_token()
    challenge = challenge_mint(costly_node.id)
    costly = _group(COSTLY, proof.task_seed(challenge), challenge=challenge)
    honest = _group(CHEAP, 8)
    datasets.datasets_forget()  # the test's make_group built them here
    results = rollout_share_batch(
        shares=[ShareIn(costly_node, _rollouts(costly)), ShareIn(honest_node, _rollouts(honest))],
        catalogue=CATALOGUE,
        swarm=default_swarm(),
    )
    assert [r.accepted for r in results] == [[costly["id"]], [honest["id"]]]
    assert results[0].verification_seconds > 0.1 > results[1].verification_seconds, results


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_rate_counts")
async def test_a_node_building_fresh_seeds_runs_out_of_its_cpu_budget(fresh_cache, settings):
    settings.SAPO_CHALLENGE_SECONDS = 0  # a fresh challenge, so a fresh seed, with every ack
    entries = [{"dataset": s.dataset, "config": s.config, "weight": 1.0} for s in CATALOGUE.tasks]
    staff = await sync_to_async(make_user)(is_staff=True)
    await sync_to_async(swarm_create)(actor=staff, slug="primes", title="Primes", entries=entries)
    node, token = await sync_to_async(make_node_with_token)()
    socket = await open_socket(token)
    challenge = (await ask(socket, {"type": "hello", "v": 1, "swarm": "primes"}))["challenge"]
    for i in range(40):
        group = await sync_to_async(_group)(COSTLY, proof.task_seed(challenge), challenge=challenge)
        await sync_to_async(datasets.datasets_forget)()  # built here by make_group: the server's to build
        reply = await ask(socket, share_frame(group, ref=str(i)))
        if reply["type"] == "error":
            break
        # Built in its worker; a worker starved past its wall clock is refused, and paid for all the same.
        refused = [{"id": group["id"], "reason": "build_refused"}]
        assert reply["accepted"] == [group["id"]] or reply["rejected"] == refused, reply
        challenge = reply["challenge"]
    assert (reply["type"], reply["code"]) == ("error", "rate_limited"), reply
    assert 1 <= i < 40, i  # a few builds of 0.4 CPU-s or so (the first also measures) fill 3 CPU-s a minute
    await socket.disconnect()


def test_a_held_out_check_asks_only_cheap_datasets(fresh_cache):
    """A held-out check is the server's own doing, charged to no share: it draws its questions from the
    catalogue's datasets that are cheap to build, and asks nothing when none is."""
    builds.costs_forget()
    check = heldout_check_make(catalogue=CATALOGUE, questions=12, now=time.time(), rng=random.Random(3))
    assert check is not None
    assert {spec.key for spec, _ in check.questions} == {CHEAP.key}
    assert (
        heldout_check_make(catalogue=Catalogue("costly", (COSTLY,)), questions=4, now=time.time(), rng=random.Random(3))
        is None
    )
    assert not datasets.dataset_cached(COSTLY, protocol.HELDOUT_SEED)
