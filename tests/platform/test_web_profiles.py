"""Public contributor and node pages, the private-profile switch (anonymous everywhere, 404 for
others), leaderboard rows linking to the pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from factories import make_node
from test_community_teams import found
from test_web_data import fresh_figures, make_consumption, make_group

from community.services import team_join
from figures import stats

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


@pytest.fixture
def sharing(user, other_user):
    """alice's node "laptop" (self-described) with two accepted groups, one trained on by bob's node."""
    node = make_node(owner=user, name="laptop", model_id="tiny-mini", hardware="cpu x2")
    group = make_group(node, rewards=(1.0, 0.0), dataset="basic_arithmetic")
    make_group(node, rewards=(1.0, 1.0), dataset="chain_sum", created_at=timezone.now() - timedelta(hours=3))
    make_consumption(make_node(owner=other_user, name="desk"), group)
    make_group(make_node(owner=other_user, name="desk2"))
    return node


def test_contributor_page_shows_figures_nodes_and_team(client, user, sharing):
    team = found(user, "Night Owls")
    page = client.get("/contributors/alice/").content.decode()
    assert "Alice" in page and 'data-figure="accepted">2<' in page and 'data-figure="helped">1<' in page
    assert 'data-figure="verified_reward">3.0<' in page
    assert "tiny-mini" in page and "cpu x2" in page and "self-reported" in page
    assert f'href="/teams/{team.slug}/"' in page and f'href="/nodes/{sharing.id}/"' in page
    assert "basic_arithmetic" in page and "chain_sum" in page
    # Per dataset and day: a column per day with groups, each dataset's reward on its day.
    row = page[page.index('data-dataset="chain_sum"') : page.index("</tr>", page.index('data-dataset="chain_sum"'))]
    # One or two day columns (the older group may be yesterday's), then the two totals.
    assert row.count('class="num"') in (1 + 2, 2 + 2)
    assert ">2.0<" in row
    assert client.get("/contributors/nobody/").status_code == 404


def test_node_page_and_its_api(client, user, sharing):
    page = client.get(f"/nodes/{sharing.id}/").content.decode()
    assert "laptop" in page and 'href="/contributors/alice/"' in page and "tiny-mini" in page
    body = client.get(f"/api/v1/public/nodes/{sharing.id}/").json()
    assert (body["accepted"], body["helped"], body["contributor"]) == (2, 1, "Alice")
    assert {d["dataset"] for d in body["datasets"]} == {"basic_arithmetic", "chain_sum"}
    assert sum(p["verified_reward"] for p in body["curve"]) == pytest.approx(3.0)
    assert body["nodes"][0]["hardware"] == "cpu x2"
    assert client.get("/nodes/999999/").status_code == 404


def test_leaderboard_rows_link_to_the_pages(client, sharing):
    stats.stats_fold()
    page = client.get("/leaderboard/").content.decode()
    assert 'href="/contributors/alice/"' in page and 'href="/contributors/bob/"' in page
    page = client.get("/leaderboard/?view=nodes").content.decode()
    assert f'href="/nodes/{sharing.id}/"' in page


def test_a_private_profile_is_anonymous_everywhere(client, user, other_user, sharing):
    team = found(other_user, "Early Larks")
    owner = Client()
    owner.force_login(user)
    assert owner.post("/me/privacy/", {"private": "on"}).status_code == 302
    user.refresh_from_db()
    assert user.profile_private
    fresh_figures()
    # Pages and API: not found for anyone else, the same answer as for no such contributor.
    for path in (
        "/contributors/alice/",
        f"/nodes/{sharing.id}/",
        "/api/v1/contributors/alice/",
        f"/api/v1/public/nodes/{sharing.id}/",
    ):
        assert client.get(path).status_code == 404, path
    # Rows say "anonymous", without a link; the owner still sees their own page.
    board = client.get("/leaderboard/").content.decode()
    assert "anonymous" in board and "Alice" not in board and "/contributors/alice/" not in board
    nodes = client.get("/leaderboard/?view=nodes").content.decode()
    assert f"/nodes/{sharing.id}/" not in nodes and "Alice" not in nodes
    assert client.get("/api/v1/leaderboard/").json()["contributors"][0]["contributor"] in ("anonymous", "Bob")
    assert "Alice" not in client.get("/api/v1/leaderboard/?view=nodes").content.decode()
    own = owner.get("/contributors/alice/").content.decode()
    assert "Your profile is private" in own
    # In a team's member list too.
    team_join(user=user, team=team)
    members = client.get(f"/teams/{team.slug}/").content.decode()
    assert "anonymous" in members and "Alice" not in members
    # And back.
    owner.post("/me/privacy/", {"private": "off"})
    fresh_figures()
    assert client.get("/contributors/alice/").status_code == 200


def test_banned_contributors_and_nodes_have_no_page(client, user, sharing):
    banned_node = make_node(owner=user, name="bad", banned_at=timezone.now())
    assert client.get(f"/nodes/{banned_node.id}/").status_code == 404
    user.banned_at = timezone.now()
    user.save(update_fields=["banned_at"])
    assert client.get("/contributors/alice/").status_code == 404
    assert client.get(f"/nodes/{sharing.id}/").status_code == 404


def test_the_me_page_offers_the_switch(auth_client):
    page = auth_client.get("/me/").content.decode()
    assert "Make my profile private" in page and 'href="/contributors/alice/"' in page
    assert auth_client.get("/me/privacy/").status_code == 405


def test_contributor_page_query_count_is_flat(client, user, django_assert_max_num_queries):
    for i in range(2):
        make_group(make_node(owner=user, name=f"n{i}"))
    stats.stats_fold()
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(30) as few:
        assert client.get("/contributors/alice/").status_code == 200
    for i in range(2, 12):
        make_group(make_node(owner=user, name=f"n{i}"))
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get("/contributors/alice/").status_code == 200
