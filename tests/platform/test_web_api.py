"""The figures API: same selectors as the pages, permissions, and the OpenAPI schema."""

from __future__ import annotations

import pytest
from factories import make_node, make_user
from rest_framework.test import APIClient
from test_web_data import make_consumption, make_group, make_report

from figures import leaderboard as boards
from pool.models import Verdict

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def test_leaderboard_api_matches_the_selector(node):
    make_group(node, rewards=(1.0, 1.0))
    make_group(node, verdict=Verdict.REJECTED)
    make_consumption(make_node(), make_group(node, rewards=(1.0, 0.0)))
    body = APIClient().get("/api/v1/leaderboard/?view=nodes").json()
    assert body["view"] == "nodes" and body["total"] == 1 and body["pages"] == 1
    row = body["nodes"][0]
    figures = next(f for f in boards.node_figures_all() if f.node_id == node.id)
    assert row["verified_reward"] == figures.verified_reward == 3.0
    assert (row["accepted"], row["rejected"], row["helped"]) == (2, 1, 1)
    assert row["acceptance_rate"] == pytest.approx(2 / 3)
    contributors = APIClient().get("/api/v1/leaderboard/").json()
    assert contributors["contributors"][0]["contributor"] == "Alice"


def test_swarm_api_is_public(node):
    make_group(node)
    body = APIClient().get("/api/v1/swarm/").json()
    assert body["accepted_groups"] == 1
    assert {"nodes_online", "groups_per_minute", "pool_size", "reward_curve", "accuracy", "aha"} <= set(body)


def test_me_api_needs_a_session_and_shows_only_my_nodes(api_client, node):
    make_group(node, rewards=(1.0, 0.0))
    make_report(node, round=3, reward_mean=0.25)
    make_node(owner=make_user(), name="theirs")
    assert APIClient().get("/api/v1/me/nodes/").status_code == 403
    rows = api_client.get("/api/v1/me/nodes/").json()
    assert [r["name"] for r in rows] == ["laptop"]
    assert rows[0]["last_report"] == {"round": 3, "reward_mean": 0.25}
    assert rows[0]["verified_reward"] == 1.0


def test_curve_api_goes_through_access_node(api_client, node):
    make_group(node, rewards=(1.0, 1.0))
    assert api_client.get(f"/api/v1/me/nodes/{node.id}/curve/").json()[0]["verified_reward"] == 2.0
    theirs = make_node(owner=make_user())
    response = api_client.get(f"/api/v1/me/nodes/{theirs.id}/curve/")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_inbox_api(api_client, node):
    bad = make_group(node, verdict=Verdict.REJECTED, reason="answer_mismatch")
    make_group(node)
    rows = api_client.get("/api/v1/me/inbox/").json()
    assert [(r["id"], r["state"], r["code"], r["node"]) for r in rows] == [
        (str(bad.id), "rejected", "answer_mismatch", "laptop")
    ]
    assert rows[0]["reason"] == "Verification: Ground truth does not match its task."


def test_figures_are_in_the_openapi_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    for path in (
        "/api/v1/leaderboard/",
        "/api/v1/swarm/",
        "/api/v1/me/nodes/",
        "/api/v1/me/nodes/{node_id}/curve/",
        "/api/v1/me/inbox/",
    ):
        assert path in schema


def test_management_commands(node):
    from io import StringIO

    from django.core.management import call_command

    make_group(node)
    out = StringIO()
    call_command("sapo_stats", "fold", stdout=out)
    call_command("sapo_stats", "rebuild", stdout=out)
    call_command("sapo_wheel", stdout=out)
    lines = out.getvalue().split()
    assert lines[:2] == ["folded", "rebuilt"] and lines[2].endswith(".whl") and len(lines[3]) == 64
