"""Team figures and pages: credit counted only while a member, /teams/, /teams/<slug>/, the
leaderboard's teams tab and its API, query counts flat in teams, members and nodes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from factories import make_node, make_user
from test_community_teams import found
from test_web_data import fresh_figures, make_group

from community.models import Membership
from community.services import team_join, team_leave, team_moderate
from figures import stats, teams
from swarms.scope import SITE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def _hour(hours_ago: int):
    return (timezone.now() - timedelta(hours=hours_ago)).replace(minute=0, second=0, microsecond=0)


def _team_row(team):
    fresh_figures()
    return {f.team_id: f for f in teams.team_figures_all(scope=SITE)}[team.id]


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "live"])
def test_team_credit_counts_only_what_members_earned_while_members(user, other_user, folded):
    team = found(user)
    team_join(user=other_user, team=team)
    # other_user joined 10 hours ago and left 4 hours ago; user founded it 20 hours ago.
    Membership.objects.filter(user=user).update(joined_at=_hour(20))
    Membership.objects.filter(user=other_user).update(joined_at=_hour(10))
    member = Membership.objects.get(user=other_user)
    node, other_node = make_node(owner=user), make_node(owner=other_user)
    make_group(node, rewards=(1.0, 1.0), created_at=_hour(30) + timedelta(minutes=5))  # before founding
    make_group(node, rewards=(1.0, 0.0), created_at=_hour(2) + timedelta(minutes=5))
    make_group(other_node, rewards=(1.0, 1.0, 1.0), created_at=_hour(12) + timedelta(minutes=5))  # before joining
    make_group(other_node, rewards=(0.5, 0.5), created_at=_hour(6) + timedelta(minutes=5))  # a member
    if folded:
        stats.stats_fold()
    else:
        # Nothing folded: the live rows carry the same hours.
        stats.stats_fold(now=_hour(40))
    row = _team_row(team)
    assert (row.accepted, row.verified_reward, row.members) == (2, pytest.approx(2.0), 2)
    assert row.recent_credit > 0

    # Leaving keeps what was earned; what the leaver earns afterwards is not the team's.
    team_leave(user=other_user)
    Membership.objects.filter(id=member.id).update(left_at=_hour(4))
    make_group(other_node, rewards=(1.0, 1.0), created_at=_hour(1) + timedelta(minutes=5))
    row = _team_row(team)
    assert (row.accepted, row.verified_reward, row.members) == (2, pytest.approx(2.0), 1)


@pytest.mark.parametrize("folded", [True, False], ids=["folded", "live"])
def test_credit_is_exact_to_the_group_inside_the_hours_of_joining_and_leaving(user, other_user, folded):
    team = found(other_user)
    team_join(user=user, team=team)
    Membership.objects.filter(user=user).update(
        joined_at=_hour(3) + timedelta(minutes=30), left_at=_hour(1) + timedelta(minutes=30)
    )
    node = make_node(owner=user)
    make_group(node, rewards=(1.0, 1.0, 1.0, 1.0), created_at=_hour(3) + timedelta(minutes=10))  # before joining
    make_group(node, rewards=(1.0, 0.0), created_at=_hour(3) + timedelta(minutes=40))
    make_group(node, rewards=(1.0, 1.0), created_at=_hour(2) + timedelta(minutes=5))
    make_group(node, rewards=(0.5, 0.0), created_at=_hour(1) + timedelta(minutes=20))
    make_group(node, rewards=(1.0, 1.0, 1.0), created_at=_hour(1) + timedelta(minutes=40))  # after leaving
    stats.stats_fold() if folded else stats.stats_fold(now=_hour(40))
    row = _team_row(team)
    assert (row.accepted, row.verified_reward) == (3, pytest.approx(3.5))
    detail = teams.team_detail(team=team, members=[], scope=SITE)
    assert sum(p["verified_reward"] for p in detail.curve) == pytest.approx(3.5)


def test_joining_and_leaving_in_the_same_hour_counts_what_was_between(user, other_user):
    team = found(other_user)
    team_join(user=user, team=team)
    Membership.objects.filter(user=user).update(
        joined_at=_hour(2) + timedelta(minutes=20), left_at=_hour(2) + timedelta(minutes=40)
    )
    node = make_node(owner=user)
    for minute, reward in ((10, 1.0), (30, 0.25), (50, 1.0)):
        make_group(node, rewards=(reward, 0.0), created_at=_hour(2) + timedelta(minutes=minute))
    stats.stats_fold()
    assert _team_row(team).verified_reward == pytest.approx(0.25)


def test_banned_nodes_earn_their_team_nothing(user):
    team = found(user)
    Membership.objects.filter(user=user).update(joined_at=_hour(5))
    make_group(make_node(owner=user), created_at=_hour(2))
    make_group(make_node(owner=user, banned_at=timezone.now()), rewards=(1.0, 1.0), created_at=_hour(2))
    stats.stats_fold()
    assert _team_row(team).verified_reward == pytest.approx(1.0)


def test_teams_page_lists_searches_and_sorts(client, user, other_user):
    owls, larks = found(user, "Night Owls"), found(other_user, "Early Larks")
    Membership.objects.filter(user=user).update(joined_at=_hour(5))
    make_group(make_node(owner=user), rewards=(1.0, 1.0), created_at=_hour(2))
    stats.stats_fold()
    page = client.get("/teams/").content.decode()
    assert page.index("Night Owls") < page.index("Early Larks")  # more credit first
    page = client.get("/teams/?sort=name&order=asc").content.decode()
    assert page.index("Early Larks") < page.index("Night Owls")
    page = client.get("/teams/?q=lark").content.decode()
    assert "Early Larks" in page and "Night Owls" not in page
    assert client.get("/teams/?sort=bogus&page=x&q=" + "z" * 500).status_code == 200
    assert larks.slug in client.get("/leaderboard/?view=teams").content.decode()
    assert owls.slug in client.get("/leaderboard/table/?view=teams").content.decode()


def test_found_join_and_leave_through_the_pages(auth_client, user, other_user):
    client = Client()
    response = auth_client.post("/teams/found/", {"name": "Night Owls", "description": "<b>bold</b> claims"})
    assert response.status_code == 302 and response["Location"] == "/teams/night-owls/"
    page = auth_client.get("/teams/night-owls/").content.decode()
    assert "&lt;b&gt;bold&lt;/b&gt; claims" in page and "<b>bold</b>" not in page
    assert "Hand over" in page and "Disband team" in page

    client.force_login(other_user)
    assert "Join team" in client.get("/teams/night-owls/").content.decode()
    assert client.post("/teams/night-owls/join/").status_code == 302
    assert Membership.objects.filter(user=other_user, team__slug="night-owls", left_at__isnull=True).exists()
    assert "Leave team" in client.get("/teams/night-owls/").content.decode()
    client.post("/teams/leave/")
    assert not Membership.objects.filter(user=other_user, left_at__isnull=True).exists()

    # A refused action says why on the page it returns to.
    response = auth_client.post("/teams/leave/", follow=True)
    assert "hand it over or disband it" in response.content.decode()
    response = auth_client.post("/teams/found/", {"name": "x"}, follow=True)
    assert "A team name has" in response.content.decode()


def test_team_actions_need_login_post_and_rights(client, user, other_user):
    team = found(user)
    assert client.post(f"/teams/{team.slug}/join/").status_code == 302  # to the log-in page
    assert not Membership.objects.filter(team=team, user__isnull=False).exclude(user=user).exists()
    client.force_login(other_user)
    assert client.get(f"/teams/{team.slug}/join/").status_code == 405
    response = client.post(f"/teams/{team.slug}/disband/", follow=True)
    assert "Only the team&#x27;s founder" in response.content.decode()
    response = client.post(f"/teams/{team.slug}/moderate/", {"action": "hide", "reason": "x"}, follow=True)
    assert "Only staff" in response.content.decode()
    assert client.get("/teams/no-such-team/").status_code == 404


def test_hidden_teams_are_not_found_by_others(client, user):
    team = found(user)
    team_moderate(actor=make_user(is_staff=True), team=team, action="hide", reason="spam")
    assert client.get(f"/teams/{team.slug}/").status_code == 404
    assert team.name not in client.get("/teams/").content.decode()
    client.force_login(user)
    assert "Hidden by the moderators" in client.get(f"/teams/{team.slug}/").content.decode()


def test_the_api_serves_the_teams_tab(client, user):
    team = found(user)
    body = client.get("/api/v1/leaderboard/?view=teams").json()
    assert body["view"] == "teams" and body["teams"][0]["slug"] == team.slug
    assert set(body["teams"][0]) >= {"name", "members", "verified_reward", "recent_credit", "badges"}


def _grow(n_teams: int, members_each: int, nodes_each: int) -> None:
    for _ in range(n_teams):
        founder = make_user()
        team = found(founder, f"Team {founder.username}")
        for _ in range(members_each - 1):
            team_join(user=make_user(), team=team)
        for member in Membership.objects.filter(team=team):
            member.joined_at = _hour(6)
            member.save(update_fields=["joined_at"])
            for _ in range(nodes_each):
                make_group(make_node(owner=member.user), created_at=_hour(2))
    stats.stats_fold()


@pytest.mark.parametrize("path", ["/teams/", "/leaderboard/?view=teams", "TEAM"])
def test_team_pages_query_count_is_flat(client, user, path, django_assert_max_num_queries):
    team = found(user, "Measured Team")
    target = f"/teams/{team.slug}/" if path == "TEAM" else path
    _grow(1, 2, 1)
    make_group(make_node(owner=user))  # live rows in both measurements: their queries run in both
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(40) as few:
        assert client.get(target).status_code == 200
    _grow(4, 3, 2)
    for _ in range(4):
        team_join(user=(u := make_user()), team=team)
        make_group(make_node(owner=u))
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(target).status_code == 200
