"""In a real browser: the alerts panel of /me/ (saved settings, listed alerts) and the swarm page's
"Swarm against silo" panel, whose chart draws one line per arm."""

from __future__ import annotations

from datetime import timedelta

from django.core.cache import cache
from django.utils import timezone
from factories import make_credited_group, make_node
from playwright.sync_api import expect

from alerts.models import Alert, Condition
from figures.leaderboard import FIGURES_CACHE_SECONDS
from figures.stats import stats_rebuild
from nodes.models import Node
from pool.models import NodeRound, RolloutText
from swarms.services import swarm_default_ensure


def _group(node: Node, rewards: tuple[float, ...], created_at) -> None:
    """An accepted, credited group as the pool stores it (no re-verification: the figures are under test)."""
    rollout = make_credited_group(node, rewards, created_at)  # credited: the figures count audited work
    RolloutText.objects.create(
        rollout=rollout,
        swarm_id=rollout.swarm_id,
        created_at=created_at,
        question="What is 1 + 1?",
        answer="2",
        completions=[f"<answer>{r}</answer>" for r in rewards],
    )
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now())


def test_a_contributor_sets_email_alerts_and_sees_them_listed(live_server, page, user, login, screenshot):
    node = make_node(owner=user, name="laptop")
    Alert.objects.create(
        user=user,
        node=node,
        condition=Condition.SILENT,
        detail="Nothing heard from the node for 31 minutes.",
        raised_at=timezone.now() - timedelta(hours=1),
        raised_delivery="email",
        raised_sent=True,
    )
    login(page, user)
    page.goto(live_server.url + "/me/")
    expect(page.locator("#alert-list")).to_contain_text("Nothing heard from the node for 31 minutes.")
    page.get_by_label("Email alerts").check()
    page.get_by_label("Silent for (minutes)").fill("10")
    page.get_by_role("button", name="Save alerts").click()
    expect(page.locator(".messages")).to_contain_text("Alert settings saved.")
    expect(page.locator(".messages")).to_contain_text("Email alerts wait for a confirmed address")
    expect(page.locator("#alert-email-help")).to_contain_text("set one under Account")
    expect(page.get_by_label("Email alerts")).to_be_checked()
    expect(page.get_by_label("Silent for (minutes)")).to_have_value("10")

    page.get_by_label("Webhook URL").fill("http://10.0.0.5/hook")
    page.get_by_role("button", name="Save alerts").click()
    expect(page.locator(".messages")).to_contain_text("not public")
    screenshot(page, "me-alerts")


def test_the_swarm_page_draws_both_arms(live_server, page, screenshot):
    sharer, loner = make_node(name="sharer"), make_node(name="loner")
    swarm = swarm_default_ensure()
    NodeRound.objects.create(node=sharer, swarm=swarm, round=1, figures={"external": 4}, used_count=0)
    NodeRound.objects.create(node=loner, swarm=swarm, round=1, figures={"external": 0}, used_count=0)
    for hours in (3, 2, 1, 0):
        when = timezone.now() - timedelta(hours=hours)
        _group(sharer, (1.0, 1.0, 0.0), when)
        _group(loner, (1.0, 0.0, 0.0), when)
    # Rows dated in the past: an earlier test's page may have folded past their hours, so
    # count them as an operator's `sapo_stats rebuild` would.
    stats_rebuild()
    cache.clear()
    # The server process keeps the swarm figures for FIGURES_CACHE_SECONDS (its own cache, which the
    # line above does not reach): a page of an earlier test may have cached them without these nodes.
    page.wait_for_timeout(1000 * FIGURES_CACHE_SECONDS + 500)
    page.goto(live_server.url + "/swarm/")
    chart = page.locator("#arms-chart")
    expect(chart.locator("path.line.series-0")).to_have_count(1)
    expect(chart.locator("path.line.series-1")).to_have_count(1)
    expect(chart.locator("circle.dot.series-1")).to_have_count(4)
    expect(chart.locator(".chart-legend")).to_contain_text("Sharing")
    expect(chart.locator(".chart-legend")).to_contain_text("Silo (own groups only)")
    figures = page.locator("#arms-figures")
    expect(figures).to_contain_text("0.667")
    expect(figures).to_contain_text("0.333")
    expect(figures).to_contain_text("+0.333")
    screenshot(page, "swarm-arms")
