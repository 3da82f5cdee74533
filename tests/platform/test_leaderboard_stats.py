"""The figures behind the leaderboard: folding the pool, live rows, and every figure's definition."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone
from factories import make_node, make_user
from test_web_data import fresh_figures, make_consumption, make_group, make_report

from figures import credit, profiles, stats
from figures import leaderboard as boards
from figures import swarm as swarm_figures
from figures.models import DatasetHour, NodeHour, NodeStats, StatsCursor
from moderation.selectors import rollout_inbox_list
from pool.models import ModerationStatus, Verdict
from swarms.scope import SITE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def _figures(node) -> boards.NodeFigures:
    fresh_figures()
    return {f.node_id: f for f in boards.node_figures_all()}[node.id]


def test_verified_reward_counts_accepted_groups_not_moderated_out(node):
    make_group(node, rewards=(1.0, 0.0, 1.0))
    make_group(node, rewards=(0.5, 0.5), verdict=Verdict.REJECTED)
    make_group(node, rewards=(1.0, 1.0), moderation_status=ModerationStatus.QUARANTINED)
    f = _figures(node)
    assert f.verified_reward == pytest.approx(2.0)
    assert (f.accepted, f.rejected, f.moderated) == (2, 1, 1)
    assert f.acceptance_rate == pytest.approx(2 / 3)
    assert f.completions == 3


def test_folded_and_live_rows_add_up_to_the_same_figures(node):
    old = timezone.now() - timedelta(hours=3)
    make_group(node, rewards=(1.0, 0.0), created_at=old)
    make_group(node, rewards=(1.0, 1.0), created_at=old + timedelta(minutes=1))
    before = _figures(node)  # first read folds everything older than the lag
    assert StatsCursor.objects.get().folded_until > old
    assert NodeStats.objects.get(node=node).accepted_groups == 2

    make_group(node, rewards=(1.0, 0.0, 0.0))  # live: newer than the fold
    after = _figures(node)
    assert after.accepted == 3
    assert after.verified_reward == pytest.approx(before.verified_reward + 1.0)

    # Folding later moves the live row into the tables without counting anything twice.
    stats.stats_fold(now=timezone.now() + timedelta(minutes=10))
    refolded = _figures(node)
    assert (refolded.accepted, refolded.verified_reward) == (3, pytest.approx(4.0))
    assert NodeStats.objects.get(node=node).accepted_groups == 3
    assert sum(h.accepted_groups for h in NodeHour.objects.filter(node=node)) == 3
    assert sum(h.credited_completions for h in DatasetHour.objects.all()) == 7


def test_fold_is_idempotent_when_nothing_new(node):
    make_group(node, created_at=timezone.now() - timedelta(hours=1))
    stats.stats_fold()
    stats.stats_fold()
    assert NodeStats.objects.get(node=node).accepted_groups == 1


def test_rows_of_quiet_nodes_are_not_rescanned(node, django_assert_max_num_queries):
    make_group(node, created_at=timezone.now() - timedelta(days=2))
    stats.stats_fold()
    # Ten quiet nodes add no per-node query: the fold is a fixed number of statements.
    for _ in range(10):
        make_node()
    with django_assert_max_num_queries(14):
        stats.stats_fold(now=timezone.now() + timedelta(minutes=5))


def test_helpfulness_counts_each_consuming_node_and_group_once(node):
    author_group = make_group(node)
    other_group = make_group(node)
    reader_a, reader_b = make_node(), make_node()
    make_consumption(reader_a, author_group)
    make_consumption(reader_b, author_group)
    make_consumption(reader_a, other_group)
    assert _figures(node).helped == 3
    stats.stats_fold(now=timezone.now() + timedelta(minutes=10))
    assert _figures(node).helped == 3


def test_recent_credit_halves_every_seven_days(node):
    now = timezone.now()
    assert credit.recent_average_credit(0.0, now=now) == 0.0
    make_group(node, rewards=(1.0, 1.0), created_at=now - timedelta(days=7))
    growth = 2.0 * 2 ** ((now - timedelta(days=7) - credit.CREDIT_EPOCH) / credit.CREDIT_HALF_LIFE)
    expected = 2.0 * 0.5 * math.log(2) / 7
    assert credit.recent_average_credit(growth, now=now) == pytest.approx(expected)
    assert _figures(node).recent_credit == pytest.approx(expected, rel=1e-3)


def test_steady_rate_converges_to_that_rate():
    # A twenty-fourth of a unit every hour for a year reads as one unit per day.
    now = credit.CREDIT_EPOCH + timedelta(days=400)
    growth = sum(
        2 ** ((now - timedelta(hours=h) - credit.CREDIT_EPOCH) / credit.CREDIT_HALF_LIFE) / 24 for h in range(365 * 24)
    )
    assert credit.recent_average_credit(growth, now=now) == pytest.approx(1.0, rel=0.01)


def test_rounds_are_self_reported_counts(node):
    make_report(node, round=1)
    make_report(node, round=2)
    make_group(node)
    assert _figures(node).rounds == 2


def test_contributors_sum_their_nodes_and_banned_ones_are_hidden():
    alice = make_user(display_name="Alice A")
    laptop, desktop = make_node(owner=alice), make_node(owner=alice)
    make_group(laptop, rewards=(1.0, 0.0))
    make_group(desktop, rewards=(1.0, 1.0))
    banned = make_user(display_name="Mallory")
    make_group(make_node(owner=banned), rewards=(1.0, 1.0, 1.0))
    banned.banned_at = timezone.now()
    banned.save(update_fields=["banned_at"])
    board = boards.leaderboard(view="contributors", scope=SITE)
    rows = list(board.page.object_list)
    assert [r.contributor for r in rows] == ["Alice A"]
    assert rows[0].verified_reward == pytest.approx(3.0) and rows[0].nodes == 2
    nodes = boards.leaderboard(view="nodes", sort="reward", scope=SITE)
    assert [r.node_id for r in nodes.page.object_list] == [desktop.id, laptop.id]


def test_only_nodes_with_accepted_groups_get_a_leaderboard_row(node):
    """A node that only ever reports (or only shares junk) gets no public row."""
    make_group(node)
    reporter, junk = make_node(name="reporter"), make_node(name="junk")
    for r in range(1, 4):
        make_report(reporter, round=r)
    make_group(junk, verdict=Verdict.REJECTED)
    fresh_figures()
    assert _figures(reporter).rounds == 3  # its owner still sees its figures (/me/)
    assert [r.node_id for r in boards.leaderboard(view="nodes", scope=SITE).page.object_list] == [node.id]
    assert [r.owner_id for r in boards.leaderboard(view="contributors", scope=SITE).page.object_list] == [node.owner_id]
    swarm = swarm_figures.swarm_overview(scope=SITE)
    assert swarm["nodes_total"] == 1
    assert swarm["acceptance_rate"] == pytest.approx(0.5)  # the junk node's rejection still counts


def test_leaderboard_sorts_and_paginates():
    for i in range(boards.PAGE_SIZE + 3):
        make_group(make_node(name=f"n{i:02d}"), rewards=(1.0,) * (i % 5 + 1))
    board = boards.leaderboard(view="nodes", sort="name", order="asc", page=2, scope=SITE)
    assert board.total == boards.PAGE_SIZE + 3
    assert [r.name for r in board.page.object_list] == ["n25", "n26", "n27"]
    top = boards.leaderboard(view="nodes", sort="reward", scope=SITE)
    assert list(top.page.object_list)[0].verified_reward == 5.0
    odd = boards.leaderboard(view="bogus", sort="bogus", page="x", scope=SITE)
    assert (odd.view, odd.sort, odd.page.number) == ("contributors", "reward", 1)


def test_swarm_overview_figures(node):
    make_group(node, rewards=(1.0, 0.0), dataset="basic_arithmetic")
    make_group(node, rewards=(1.0, 1.0), dataset="bf")
    make_group(node, verdict=Verdict.REJECTED)
    a, b = make_node(), make_node()
    aha = make_group(node, rewards=(1.0, 0.0))
    make_consumption(a, aha)
    make_consumption(b, aha)
    swarm = swarm_figures.swarm_overview(scope=SITE)
    assert swarm["groups_per_minute"] == pytest.approx(0.4)
    assert swarm["pool_size"] == 2
    assert swarm["acceptance_rate"] == pytest.approx(0.75)
    accuracy = {row["dataset"]: row["accuracy"] for row in swarm["accuracy"]}
    assert accuracy == {"basic_arithmetic": pytest.approx(0.5), "bf": pytest.approx(1.0)}
    assert swarm["reward_curve"][-1]["mean_reward"] == pytest.approx(4 / 6)  # credited: (1, 0), (1, 1), (1, 0)
    assert [g["id"] for g in swarm["aha"]] == [aha.id]
    assert swarm["aha"][0]["nodes_trained"] == 2


def test_node_curve_and_inbox(user, node):
    make_group(node, rewards=(1.0, 1.0), created_at=timezone.now() - timedelta(days=1))
    make_group(node, rewards=(1.0, 0.0))
    bad = make_group(node, verdict=Verdict.REJECTED, reason="question_mismatch")
    held = make_group(node, moderation_status=ModerationStatus.QUARANTINED)
    make_group(make_node(), verdict=Verdict.REJECTED)  # someone else's
    curve = profiles.node_curve(node=node)
    assert [p["verified_reward"] for p in curve] == [2.0, 1.0]
    assert {e.rollout.id for e in rollout_inbox_list(owner=user)} == {bad.id, held.id}


def test_rebuild_recounts_from_scratch(node):
    group = make_group(node, rewards=(1.0, 1.0), created_at=timezone.now() - timedelta(hours=1))
    stats.stats_fold()
    group.moderation_status = ModerationStatus.QUARANTINED
    group.save(update_fields=["moderation_status"])
    assert NodeStats.objects.get(node=node).verified_reward == 2.0
    stats.stats_rebuild()
    assert NodeStats.objects.get(node=node).verified_reward == 0.0


def test_moderation_moves_folded_credit_both_ways(node):
    from pool.services import rollout_set_moderation

    old = make_group(node, rewards=(1.0, 1.0), created_at=timezone.now() - timedelta(hours=1))
    make_group(node, rewards=(1.0, 0.0), created_at=timezone.now() - timedelta(hours=1))
    stats.stats_fold()
    before = _figures(node)
    # The pool announces the change (pool.signals) and the folded figures follow it.
    rollout_set_moderation(rollouts=[old.id], status=ModerationStatus.QUARANTINED)
    taken_out = _figures(node)
    assert taken_out.verified_reward == pytest.approx(before.verified_reward - 2.0)
    assert (taken_out.moderated, taken_out.completions) == (1, 2)
    assert sum(h.verified_reward for h in DatasetHour.objects.all()) == pytest.approx(1.0)
    # Moderated out again (another status): nothing moves. Back to ok: the credit returns.
    assert stats.node_stats_apply_moderation(rollouts=[old.id], status=ModerationStatus.REJECTED) == 0
    rollout_set_moderation(rollouts=[old.id], status=ModerationStatus.REJECTED)
    assert _figures(node).verified_reward == pytest.approx(taken_out.verified_reward)
    rollout_set_moderation(rollouts=[old.id], status=ModerationStatus.OK)
    back = _figures(node)
    assert (back.verified_reward, back.moderated) == (pytest.approx(before.verified_reward), 0)
    assert back.recent_credit == pytest.approx(before.recent_credit)
    # And a full recount agrees with the incremental figures.
    stats.stats_rebuild()
    assert _figures(node).verified_reward == pytest.approx(before.verified_reward)


def test_pool_size_is_exact_when_small_and_a_bound_when_large(node, monkeypatch):
    first = make_group(node, rewards=(1.0, 0.0))
    make_group(node, rewards=(1.0, 1.0))  # no variance: never sampleable
    last = make_group(node, rewards=(0.0, 1.0))
    cutoff = timezone.now() - timedelta(hours=1)
    swarms = [first.swarm_id]
    assert swarm_figures._pool_size(cutoff, swarms) == 2
    monkeypatch.setattr(swarm_figures, "POOL_COUNT_EXACT_BELOW", 1)
    assert swarm_figures._pool_size(cutoff, swarms) == last.sample_seq - first.sample_seq + 1


def test_a_group_of_more_completions_than_the_swarms_g_earns_no_more_than_a_group_of_g(node):
    """The group-worth bound (SAPO_CREDIT_COMPLETIONS, G = 8): a group of n completions is credited its
    verified rewards' sum times min(1, G / n), in the SQL and in its Python twin alike."""
    from django.db import connection
    from psycopg import sql

    from pool.models import Rollout

    assert credit.CREDIT_COMPLETIONS == 8
    groups = [
        make_group(node, rewards=(1.0,) * 4 + (0.0,) * 4),  # 8 completions: 4
        make_group(node, rewards=(1.0,) * 31 + (0.0,)),  # 32 completions, 31 right: 31 x 8 / 32
        make_group(node, rewards=(1.0, 0.0, 1.0)),  # fewer than G: 2, unscaled
    ]
    Rollout.objects.update(audit_state="audited")  # credit is audited work (figures.credit.credited)
    assert _figures(node).verified_reward == pytest.approx(4.0 + 7.75 + 2.0)
    query = sql.SQL("SELECT r.id, {reward} FROM pool_rollout r").format(reward=credit.reward("r"))
    with connection.cursor() as cursor:
        cursor.execute(query.as_string(connection.connection))
        by_sql = dict(cursor.fetchall())
    for group in groups:
        assert by_sql[group.id] == credit.group_reward(group.verified_rewards, group.completion_count)
    assert sorted(by_sql.values()) == [2.0, 4.0, 7.75]
