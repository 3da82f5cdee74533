"""A swarm's catalogue on a live server (daphne, PostgreSQL, Redis), over real sockets:

- a share naming a fresh seed of a dataset costly to build (a count_primes whose sieve takes the
  server's memory for every seed, which passes the catalogue check) is refused with `build_refused`
  within the check's bounds, while another node's socket is answered meanwhile; the server builds
  nothing for it;
- staff withdraw a dataset from a swarm's catalogue: a socket opened before the change is told the
  new catalogue in a welcome (with the swarm's state as it is then), its next share of the withdrawn dataset is refused with
  `task_withdrawn`, and one of a kept dataset is accepted under the new version.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from factories import make_node_with_token, make_user
from support.live_nodes import TIMEOUT, open_node
from support.pool import make_group, share_frame

from pool.models import Rollout
from sapo_node.entry_check import BUILD_WALL_SECONDS
from sapo_node.tasks import Catalogue, TaskSpec
from swarms.services import swarm_catalogue_set, swarm_create, swarm_state_set

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

#: A count_primes past the cheap bounds (pool.builds): a sieve of 5 million flags, about 40 MiB and
#: 0.4 CPU-s a seed. The issue's 40 million (305 MiB, 3.3 CPU-s) is the bench's (docs/protocol.md).
COSTLY = {"dataset": "count_primes", "config": {"min_n": 1, "max_n": 5_000_000}, "weight": 1.0}
EASY_TWO = [
    {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}},
    {"dataset": "base_conversion", "config": {"min_base": 2, "max_base": 10, "min_value": 1, "max_value": 15}},
]
#: What an order may take to reach a socket: the channel layer at once, the database's path within
#: SAPO_SOCKET_ORDERS_SECONDS (2 s), and a loaded machine's slack.
WITHIN = 10.0


def _catalogue(entries: list[dict]) -> Catalogue:
    return Catalogue("t", tuple(TaskSpec(e["dataset"], dict(e["config"])) for e in entries))


def _reply(ws, ref: str) -> dict:
    """The frame answering `ref` (frames without a ref, such as a welcome, are skipped)."""
    deadline = time.monotonic() + TIMEOUT + BUILD_WALL_SECONDS
    while True:
        frame = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if frame.get("ref") == ref:
            return frame


def test_a_fresh_seed_of_a_costly_dataset_is_refused_without_blocking_the_socket(swarm_server) -> None:
    staff = make_user(is_staff=True)
    swarm_create(actor=staff, slug="primes", title="Primes", entries=[COSTLY, EASY_TWO[0]])
    catalogue = _catalogue([COSTLY, EASY_TWO[0]])
    _, token = make_node_with_token()
    _, other_token = make_node_with_token()
    with open_node(swarm_server, token, swarm="primes") as ws, open_node(swarm_server, other_token) as other:
        took = []
        for seed in (11, 12):  # node-chosen seeds, no challenge: nothing is built for them
            group = make_group("count_primes", catalogue=catalogue, seed=seed, index=3)
            started = time.monotonic()
            ws.send(json.dumps(share_frame(group, ref=f"p{seed}")))
            other.send(json.dumps({"type": "sample", "v": 1, "n": 1, "ref": f"s{seed}"}))
            served = _reply(other, f"s{seed}")
            answered_other = time.monotonic() - started
            reply = _reply(ws, f"p{seed}")
            took.append(time.monotonic() - started)
            assert served["type"] == "samples", served
            assert reply["rejected"] == [{"id": group["id"], "reason": "build_refused"}], reply
            if seed == 11:  # the first measures the dataset, once, in a worker: the other socket is served meanwhile
                assert took[0] < BUILD_WALL_SECONDS + 5.0, took
                assert answered_other < took[0] / 2, (answered_other, took)
        assert took[1] < 2.0, took  # its cost known: a fresh seed is refused at once
        honest = make_group("basic_arithmetic", catalogue=catalogue, seed=99, index=4)
        ws.send(json.dumps(share_frame(honest, ref="h")))
        assert _reply(ws, "h")["accepted"] == [honest["id"]]
    assert Rollout.objects.get(id=group["id"]).reason == "build_refused"


def test_a_dataset_withdrawn_by_staff_is_refused_on_a_socket_opened_before(swarm_server) -> None:
    staff = make_user(is_staff=True)
    swarm = swarm_create(actor=staff, slug="cat", title="Cat", entries=EASY_TWO)
    before = _catalogue(EASY_TWO)
    _, token = make_node_with_token()
    with open_node(swarm_server, token, swarm="cat") as ws:
        first = make_group("basic_arithmetic", catalogue=before, index=1)
        ws.send(json.dumps(share_frame(first, ref="a")))
        assert _reply(ws, "a")["accepted"] == [first["id"]]

        # Paused before the change: the welcome that tells the new catalogue says so too, not its first one.
        swarm_state_set(actor=staff, swarm=swarm, state="paused", reason="a new catalogue")
        assert json.loads(ws.recv(timeout=WITHIN))["state"] == "paused"
        swarm_catalogue_set(actor=staff, swarm=swarm, entries=EASY_TWO[1:], reason="withdraw basic_arithmetic")
        told = json.loads(ws.recv(timeout=WITHIN))
        assert told["type"] == "welcome" and "ref" not in told, told
        assert (told["swarm"]["catalogue_version"], told["swarm"]["state"]) == (2, "paused")
        assert [t["dataset"] for t in told["catalogue"]["tasks"]] == ["base_conversion"]
        swarm_state_set(actor=staff, swarm=swarm, state="open", reason="done")
        assert json.loads(ws.recv(timeout=WITHIN))["state"] == "open"

        withdrawn = make_group("basic_arithmetic", catalogue=before, index=2)
        kept = make_group("base_conversion", catalogue=before, index=3)
        ws.send(json.dumps(share_frame(withdrawn, kept, ref="b")))
        reply = _reply(ws, "b")
        assert reply["rejected"] == [{"id": withdrawn["id"], "reason": "task_withdrawn"}], reply
        assert reply["accepted"] == [kept["id"]], reply
    versions = dict(Rollout.objects.values_list("id", "catalogue_version"))
    assert [versions[uuid.UUID(g["id"])] for g in (first, withdrawn, kept)] == [1, 2, 2]
