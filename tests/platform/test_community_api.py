"""The community API: teams (list, detail, found, join, leave), public pages and the privacy switch,
with typed error codes, permissions and their place in the OpenAPI schema."""

from __future__ import annotations

import pytest
from factories import make_node, make_user
from rest_framework.test import APIClient
from test_web_data import fresh_figures, make_group

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def _as(user) -> APIClient:
    api = APIClient()
    api.force_login(user)
    return api


def test_found_join_leave_through_the_api(api_client, other_user):
    created = api_client.post(
        "/api/v1/teams/", {"name": "Night Owls", "description": "We run at night."}, format="json"
    )
    assert created.status_code == 201 and created.json() == {"name": "Night Owls", "slug": "night-owls"}
    again = api_client.post("/api/v1/teams/", {"name": "Other"}, format="json")
    assert (again.status_code, again.json()["code"]) == (409, "already_in_team")

    bob = _as(other_user)
    assert bob.get("/api/v1/me/team/").json()["code"] == "not_in_team"
    joined = bob.post("/api/v1/teams/night-owls/join/")
    assert joined.status_code == 200 and joined.json()["team"]["slug"] == "night-owls"
    assert bob.get("/api/v1/me/team/").json()["left_at"] is None
    detail = bob.get("/api/v1/teams/night-owls/").json()
    assert [m["contributor"] for m in detail["members"]] == ["Alice", "Bob"] and detail["figures"]["members"] == 2
    left = bob.delete("/api/v1/me/team/")
    assert left.status_code == 200 and left.json()["left_at"] is not None
    founder_leaves = api_client.delete("/api/v1/me/team/")
    assert (founder_leaves.status_code, founder_leaves.json()["code"]) == (409, "founder_must_hand_over")

    listed = APIClient().get("/api/v1/teams/?q=owl").json()
    assert [t["slug"] for t in listed] == ["night-owls"]
    assert APIClient().get("/api/v1/teams/no-such/").json()["code"] == "not_found"


def test_bad_input_gets_typed_errors(api_client):
    bad = api_client.post("/api/v1/teams/", {"name": "x"}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_team_name")
    bad = api_client.post("/api/v1/teams/", {"name": "Good Name", "url": "javascript:alert(1)"}, format="json")
    assert bad.json()["code"] == "invalid_team_url"
    bad = api_client.post("/api/v1/teams/", {"description": "no name"}, format="json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid")


def test_writes_need_a_login_and_csrf(user):
    anonymous = APIClient()
    assert anonymous.post("/api/v1/teams/", {"name": "Night Owls"}, format="json").status_code == 403
    assert anonymous.patch("/api/v1/me/profile/", {"private": True}, format="json").status_code == 403
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(user)
    refused = browser.post("/api/v1/teams/", {"name": "Night Owls"}, format="json")
    assert refused.status_code == 403


def test_the_privacy_switch_and_public_pages(api_client, user, other_user):
    make_group(make_node(owner=user, name="laptop"))
    assert APIClient().get("/api/v1/contributors/alice/").json()["contributor"] == "Alice"
    assert api_client.patch("/api/v1/me/profile/", {"private": True}, format="json").json() == {"private": True}
    fresh_figures()
    hidden = APIClient().get("/api/v1/contributors/alice/")
    assert (hidden.status_code, hidden.json()["code"]) == (404, "not_found")
    assert _as(other_user).get("/api/v1/contributors/alice/").status_code == 404
    own = api_client.get("/api/v1/contributors/alice/").json()  # the contributor still sees their own
    assert own["contributor"] == "anonymous" and own["accepted"] == 1
    assert api_client.get("/api/v1/me/profile/").json() == {"private": True}


def test_the_community_api_is_in_the_openapi_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    for path in (
        "/api/v1/teams/",
        "/api/v1/teams/{slug}/",
        "/api/v1/teams/{slug}/join/",
        "/api/v1/teams/{slug}/hand-over/",
        "/api/v1/me/team/",
        "/api/v1/me/profile/",
        "/api/v1/contributors/{username}/",
        "/api/v1/public/nodes/{node_id}/",
    ):
        assert path in schema, path
    assert '"teams"' in schema  # the leaderboard's teams view


def test_team_list_api_query_count_is_flat(client, django_assert_max_num_queries, throttle_queries):
    from community.services import team_found

    for i in range(2):
        team_found(founder=make_user(), name=f"Team {i}", address=f"10.9.0.{i}")
    fresh_figures()
    with django_assert_max_num_queries(20) as few:
        client.get("/api/v1/teams/")
    for i in range(2, 10):
        team_found(founder=make_user(), name=f"Team {i}", address=f"10.9.0.{i}")
    fresh_figures()
    with django_assert_max_num_queries(len(few.captured_queries)):
        client.get("/api/v1/teams/")


def test_the_founder_edits_hands_over_and_disbands_through_the_api(api_client, user, other_user):
    api_client.post("/api/v1/teams/", {"name": "Night Owls"}, format="json")
    bob = _as(other_user)
    edit = bob.put("/api/v1/teams/night-owls/", {"name": "Bob's Team"}, format="json")
    assert (edit.status_code, edit.json()["code"]) == (403, "not_founder")
    edit = api_client.put("/api/v1/teams/night-owls/", {"name": "Owls", "description": "Hoot"}, format="json")
    assert edit.json() == {"name": "Owls", "slug": "night-owls"}
    refused = api_client.post("/api/v1/teams/night-owls/hand-over/", {"to": other_user.id}, format="json")
    assert refused.json()["code"] == "not_a_member"
    bob.post("/api/v1/teams/night-owls/join/")
    handed = api_client.post("/api/v1/teams/night-owls/hand-over/", {"to": other_user.id}, format="json")
    assert handed.status_code == 200
    assert api_client.delete("/api/v1/teams/night-owls/").json()["code"] == "not_founder"
    assert bob.delete("/api/v1/teams/night-owls/").status_code == 204
    assert APIClient().get("/api/v1/teams/night-owls/").status_code == 404
    assert APIClient().delete("/api/v1/teams/night-owls/").status_code == 403
