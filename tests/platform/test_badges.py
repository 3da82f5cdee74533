"""Badges: BOINC's percentile rule for the top 1/5/25% by recent credit, milestones, assigned by the
scheduled command and shown on rows and pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from factories import make_node, make_user
from test_community_teams import found
from test_web_data import fresh_figures, make_consumption, make_group

from community.models import Badge, Membership
from figures import stats
from figures.badges import ACTIVE_RECENT_CREDIT, badges_assign, rank_badges, rank_thresholds
from figures.leaderboard import contributor_figures_all
from swarms.scope import SITE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def test_thresholds_follow_boincs_percentile_positions():
    credits = [float(i) for i in range(1, 101)]  # 100 active subjects: 1.0 .. 100.0
    assert rank_thresholds(credits) == [("top1", 100.0), ("top5", 96.0), ("top25", 76.0)]
    assert rank_thresholds([ACTIVE_RECENT_CREDIT, 0.0]) == []  # nobody active
    # One active subject is in the top 1% of one.
    assert rank_thresholds([5.0, 0.0]) == [("top1", 5.0), ("top5", 5.0), ("top25", 5.0)]


def test_each_subject_holds_its_best_rank_badge_only():
    subjects = {i: (10.0, float(i)) for i in range(1, 101)}
    subjects[500] = (3.0, 0.0)  # credit, but no recent credit: below every threshold
    subjects[600] = (0.0, 0.0)
    badges = rank_badges(subjects)
    assert badges[100] == "top1"
    assert [badges[i] for i in (96, 99)] == ["top5", "top5"]
    assert [badges[i] for i in (76, 95)] == ["top25", "top25"]
    assert 75 not in badges and 500 not in badges and 600 not in badges


def test_the_scheduled_command_assigns_and_recomputes(user, other_user, capsys):
    team = found(user, "Night Owls")
    Membership.objects.filter(user=user).update(joined_at=timezone.now() - timedelta(days=1))
    _age(user)
    _age(other_user)
    type(team).objects.filter(id=team.id).update(created_at=timezone.now() - timedelta(days=30))  # established
    node, other = make_node(owner=user), make_node(owner=other_user)
    for _ in range(10):  # 20 verified reward: established (figures.badges.BADGE_MIN_VERIFIED_REWARD)
        make_group(node, rewards=(1.0, 1.0))
    make_consumption(other, make_group(node))  # bob's node trained on alice's group
    make_group(other, rewards=(1.0, 0.0), created_at=timezone.now() - timedelta(days=60))
    call_command("sapo_scheduled", "--only", "badges")
    assert "badges: ok" in capsys.readouterr().out
    held = set(Badge.objects.values_list("user_id", "team_id", "kind"))
    team_id = Badge.objects.get(team__isnull=False).team_id
    assert held == {
        (user.id, None, "top1"),  # the only active contributor
        (user.id, None, "first_group"),
        (user.id, None, "first_helped"),
        (other_user.id, None, "first_group"),  # 60 days old: no longer active, no rank badge
        (None, team_id, "top1"),
    }

    # Bob gets far ahead: the rank badges move, the milestones stay.
    for _ in range(30):
        make_group(other, rewards=(1.0, 1.0))
    fresh_figures()
    call_command("sapo_scheduled", "--only", "badges")
    ranks = dict(Badge.objects.filter(user__isnull=False, kind__startswith="top").values_list("user_id", "kind"))
    assert ranks[other_user.id] == "top1" and user.id not in ranks  # of 2 active, only the best is top 25%
    assert Badge.objects.filter(user=user, kind="first_helped").exists()


def test_badges_show_on_rows_and_pages(client, user):
    _age(user)
    node = make_node(owner=user)
    for _ in range(10):
        make_group(node, rewards=(1.0, 1.0))
    stats.stats_fold()
    call_command("sapo_scheduled", "--only", "badges")
    fresh_figures()
    assert "Top 1%" in client.get("/leaderboard/").content.decode()
    page = client.get("/contributors/alice/").content.decode()
    assert "Top 1%" in page and "First accepted group" in page
    assert "top 1%" in client.get("/leaderboard/how/").content.decode().lower()


def test_badge_assignment_costs_the_same_for_more_contributors(django_assert_max_num_queries):
    from figures.badges import badges_assign

    make_group(make_node(), rewards=(1.0, 1.0))
    fresh_figures()
    badges_assign()  # the process's caches are warm in both measured calls, whatever test ran before
    for _ in range(2):
        make_group(make_node(owner=make_user()), rewards=(1.0, 1.0))
    fresh_figures()
    with django_assert_max_num_queries(40) as few:
        badges_assign()
    for _ in range(10):
        make_group(make_node(owner=make_user()), rewards=(1.0, 0.0))
    fresh_figures()
    with django_assert_max_num_queries(len(few.captured_queries)):
        badges_assign()


def _age(user, days: int = 30) -> None:
    type(user).objects.filter(id=user.id).update(date_joined=timezone.now() - timedelta(days=days))


@pytest.mark.parametrize("sybils", [0, 40])
def test_forty_cheap_accounts_move_no_real_contributors_badge(sybils):
    """Ten established contributors earning 1..10 a day for 30 days, alone or beside 40 accounts earning
    0.2 a day (above the activity line) for as long: the real ones hold the same badges either way,
    the cheap ones none."""
    days = 30
    real = []
    for i in range(1, 11):
        owner = make_user()
        _age(owner, 60)
        node = make_node(owner=owner)
        for day in range(0, days, 3):
            make_group(node, rewards=(1.5 * i, 1.5 * i), created_at=timezone.now() - timedelta(days=day, hours=1))
        real.append(owner)
    cheap = set()
    for _ in range(sybils):
        owner = make_user()
        _age(owner, 60)
        node = make_node(owner=owner)
        for day in range(0, days, 3):
            make_group(node, rewards=(0.3, 0.3), created_at=timezone.now() - timedelta(days=day, hours=1))
        cheap.add(owner.id)
    stats.stats_fold()
    fresh_figures()
    assert (
        len([c for c in contributor_figures_all(scope=SITE) if c.owner_id in cheap and 0.1 < c.recent_credit < 0.3])
        == sybils
    )
    badges_assign()
    ranks = dict(Badge.objects.filter(kind__startswith="top", user__isnull=False).values_list("user_id", "kind"))
    assert ranks == {real[9].id: "top1", real[8].id: "top25", real[7].id: "top25"}  # positions 9, 9, 7 of 10
