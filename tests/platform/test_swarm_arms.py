"""Swarm against silo on the swarm page: the maths on hand-made node-hours (figures.arms), each node's
arm from its latest round report, folded and live rows of one hour counted once, and the panel."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from factories import make_node, make_user
from rest_framework.test import APIClient
from test_web_data import fresh_figures, make_group

from figures import stats
from figures import swarm as swarm_figures
from figures.arms import SHARING, SILO, NodeHourCell, arm_of, compare_arms, t975, welch_interval
from pool.models import NodeRound
from swarms.scope import SITE
from swarms.services import swarm_default_ensure

H0 = datetime(2026, 11, 20, 10, tzinfo=UTC)


def _hour(i: int) -> datetime:
    return H0 + timedelta(hours=i)


# ---------------------------------------------------------------------------- the maths, exactly


def test_arm_of_reads_j_and_ignores_what_is_not_a_count():
    assert (
        arm_of({"external": 0}) == SILO and arm_of({"external": 4}) == SHARING and arm_of({"external": 2.0}) == SHARING
    )
    for figures in (
        None,
        {},
        {"external": None},
        {"external": -1},
        {"external": True},
        {"external": "4"},
        {"external": math.inf},
        {"external": math.nan},
    ):
        assert arm_of(figures) is None


def test_welch_interval_by_hand():
    # means 0.6 and 0.3, each variance 0.02 over 2 values: se^2 = 0.01 + 0.01, df = 0.0004 / 0.0002 = 2
    low, high = welch_interval([0.5, 0.7], [0.2, 0.4])
    half = 4.303 * math.sqrt(0.02)
    assert (low, high) == (pytest.approx(0.3 - half), pytest.approx(0.3 + half))
    assert welch_interval([0.5], [0.2, 0.4]) is None
    assert welch_interval([0.5, 0.5], [0.2, 0.2]) == (pytest.approx(0.3), pytest.approx(0.3))
    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(31) == 1.96 and t975(0.4) == 12.706


def test_compare_arms_on_hand_made_node_hours():
    cells = [
        NodeHourCell(1, _hour(0), 3.0, 4),  # sharing 0.75
        NodeHourCell(2, _hour(0), 1.0, 4),  # sharing 0.25
        NodeHourCell(1, _hour(1), 4.0, 4),  # sharing 1.0
        NodeHourCell(3, _hour(0), 2.0, 8),  # silo 0.25
        NodeHourCell(3, _hour(1), 4.0, 8),  # silo 0.5
        NodeHourCell(4, _hour(1), 8.0, 8),  # arm unknown: left out
        NodeHourCell(5, _hour(1), 0.0, 0),  # no credited completion: no value
    ]
    out = compare_arms(cells, {1: SHARING, 2: SHARING, 3: SILO, 4: None, 5: SILO})
    assert out["curve"] == [
        {"hour": _hour(0), "sharing": pytest.approx(0.5), "silo": pytest.approx(0.25)},
        {"hour": _hour(1), "sharing": pytest.approx(1.0), "silo": pytest.approx(0.5)},
    ]
    assert out["sharing"] == {"nodes": 2, "node_hours": 3, "mean_reward": pytest.approx(2 / 3)}
    assert out["silo"] == {"nodes": 1, "node_hours": 2, "mean_reward": pytest.approx(0.375)}
    assert out["unknown_nodes"] == 1
    assert out["gain"] == pytest.approx(2 / 3 - 0.375)
    # Welch by hand: sharing (0.75, 0.25, 1.0) variance 7/48; silo (0.25, 0.5) variance 1/32
    va, vb = (7 / 48) / 3, (1 / 32) / 2
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 1)
    assert int(df) == 2
    half = 4.303 * math.sqrt(va + vb)
    assert out["gain_low"] == pytest.approx(out["gain"] - half)
    assert out["gain_high"] == pytest.approx(out["gain"] + half)


def test_one_arm_alone_has_no_gain():
    out = compare_arms([NodeHourCell(1, _hour(0), 1.0, 2)], {1: SHARING})
    assert out["gain"] is None and out["gain_low"] is None and out["silo"]["nodes"] == 0
    assert out["curve"] == [{"hour": _hour(0), "sharing": 0.5, "silo": None}]


# ---------------------------------------------------------------------------- from the pool


def _report(node, round: int, **figures) -> NodeRound:
    return NodeRound.objects.create(
        node=node, swarm=swarm_default_ensure(), round=round, figures={"reward_mean": 0.5, **figures}, used_count=0
    )


@pytest.fixture
def _fresh():
    fresh_figures()
    yield
    fresh_figures()


@pytest.mark.django_db
def test_the_swarm_overview_compares_the_arms_from_reports_and_folded_plus_live_rows(_fresh):
    owner = make_user()
    sharing, silo, old_client, banned = (make_node(owner=owner, name=n) for n in ("a", "b", "c", "d"))
    _report(sharing, 1, external=0)  # an earlier run in silo: the latest report decides
    _report(sharing, 2, local=4, external=4)
    _report(silo, 7, local=4, external=0)
    _report(old_client, 1)  # no J: neither arm
    _report(banned, 1, external=0)
    banned.banned_at = timezone.now()
    banned.save(update_fields=["banned_at"])

    now = timezone.now()
    this_hour = now.replace(minute=0, second=0, microsecond=0)
    earlier = this_hour - timedelta(hours=2) + timedelta(minutes=5)
    make_group(sharing, rewards=(1.0, 1.0), created_at=earlier)
    make_group(silo, rewards=(1.0, 0.0), created_at=earlier)
    make_group(old_client, rewards=(1.0, 1.0), created_at=earlier)
    make_group(banned, rewards=(0.0, 0.0), created_at=earlier)
    if now - this_hour > timedelta(minutes=3):  # folded, and in the same hour as the live rows below
        make_group(sharing, rewards=(1.0, 1.0, 1.0, 1.0), created_at=now - timedelta(minutes=3))
    stats.stats_fold(now=now)  # groups older than the fold's lag are folded; the ones below stay live
    make_group(sharing, rewards=(0.0, 1.0), created_at=now)
    make_group(silo, rewards=(0.0, 0.0), created_at=now)

    arms = swarm_figures.swarm_overview(scope=SITE)["arms"]
    assert arms["sharing"]["nodes"] == 1 and arms["silo"]["nodes"] == 1 and arms["unknown_nodes"] == 1
    assert arms["sharing"]["node_hours"] == 2 and arms["silo"]["node_hours"] == 2  # the banned node is left out
    by_hour = {p["hour"]: p for p in arms["curve"]}
    assert by_hour[earlier.replace(minute=0)]["sharing"] == 1.0 and by_hour[earlier.replace(minute=0)]["silo"] == 0.5
    live_sharing = (1 + 4) / 6 if now - this_hour > timedelta(minutes=3) else 0.5
    assert by_hour[this_hour]["sharing"] == pytest.approx(live_sharing) and by_hour[this_hour]["silo"] == 0.0
    assert arms["gain"] == pytest.approx((1.0 + live_sharing) / 2 - 0.25)
    assert arms["gain_low"] < arms["gain"] < arms["gain_high"]

    body = APIClient().get("/api/v1/swarm/").json()
    assert body["arms"]["silo"] == {"nodes": 1, "node_hours": 2, "mean_reward": 0.25}
    assert set(body["arms"]["curve"][0]) == {"hour", "sharing", "silo"}


@pytest.mark.django_db
def test_the_swarm_page_shows_both_arms_and_says_what_the_comparison_is(client, _fresh):
    a, b = make_node(name="sharer"), make_node(name="loner")
    _report(a, 1, external=4)
    _report(b, 1, external=0)
    make_group(a, rewards=(1.0, 1.0))
    make_group(b, rewards=(1.0, 0.0))
    page = client.get("/swarm/").content.decode()
    assert "Swarm against silo" in page and 'data-series="arms.curve"' in page and 'data-y="sharing,silo"' in page
    figures = page[page.index('id="arms-figures"') :]
    assert "1.000" in figures and "0.500" in figures
    # One node-hour an arm gives a gain (+0.500) but no interval: the page shows no figure it cannot
    # bound, and says why.
    assert "+0.500" not in figures and "not enough data yet" in figures
    assert "1 node · 1 node-hour" in figures and "a figure needs two node-hours in each arm" in figures
    how = client.get("/leaderboard/how/").content.decode()
    assert "nodes <strong>choose</strong> their arm" in how and "hardware" in how
