"""Public REST views of the pool: statistics and one rollout."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from factories import make_node
from rest_framework.test import APIClient
from support.pool import SAPO, default_swarm, make_group, to_rollout_in

from pool.ingest import rollout_share
from pool.services import rollout_set_moderation

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_cached_stats():
    cache.clear()  # stats are cached for a few seconds


@pytest.fixture
def shared():
    node = make_node(name="laptop")
    good = make_group("basic_arithmetic", index=1)
    flat = make_group("base_conversion", index=2, right=2, wrong=0)
    forged = make_group("basic_arithmetic", index=3)
    forged["answer"] = "nope"
    rollout_share(
        node=node, rollouts=[to_rollout_in(g) for g in (good, flat, forged)], catalogue=SAPO, swarm=default_swarm()
    )
    return {"good": good, "flat": flat, "forged": forged}


def test_stats_count_the_pool(shared):
    body = APIClient().get("/api/v1/pool/stats/").json()
    assert body == {
        "groups": 3,
        "accepted": 2,
        "rejected": 1,
        "sampleable": 1,
        "completions": 10,
        "acceptance_rate": pytest.approx(2 / 3),
        "datasets": {
            "base_conversion": {"groups": 1, "accepted": 1, "sampleable": 0},
            "basic_arithmetic": {"groups": 2, "accepted": 1, "sampleable": 1},
        },
    }


def test_stats_of_an_empty_pool(db):
    body = APIClient().get("/api/v1/pool/stats/").json()
    assert body["groups"] == 0 and body["acceptance_rate"] is None and body["datasets"] == {}


def test_a_rollout_is_public_with_verified_rewards_author_and_verdict(shared):
    forged = shared["forged"]
    response = APIClient().get(f"/api/v1/rollouts/{forged['id']}/")
    assert response.status_code == 200
    body = response.json()
    assert body["node"] == "laptop"
    assert (body["verdict"], body["reason"]) == ("rejected", "answer_mismatch")
    assert body["question"] == forged["question"] and body["answer"] == "nope"
    assert body["completions"] == forged["completions"]
    assert body["verified_rewards"] is None  # a forged answer is rejected before any scoring
    good = APIClient().get(f"/api/v1/rollouts/{shared['good']['id']}/").json()
    assert good["verified_rewards"] == [1.0, 1.0, 0.0, 0.0]


def test_unknown_and_moderated_rollouts_are_not_found(shared):
    client = APIClient()
    assert client.get("/api/v1/rollouts/00000000-0000-0000-0000-000000000000/").json()["code"] == "not_found"
    rollout_set_moderation(rollouts=[shared["good"]["id"]], status="quarantined")
    assert client.get(f"/api/v1/rollouts/{shared['good']['id']}/").status_code == 404


def test_the_schema_documents_the_pool_endpoints(db):
    schema = APIClient().get("/api/schema/?format=json").json()
    assert "/api/v1/pool/stats/" in schema["paths"]
    assert "/api/v1/rollouts/{rollout_id}/" in schema["paths"]
