"""In a real browser: the alerts panel of /me/ (saved settings, listed alerts) and the swarm page's
"Swarm against silo" panel, whose chart draws one line per arm."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.core import signing
from django.core.cache import cache
from django.utils import timezone
from factories import make_node
from playwright.sync_api import expect

from alerts.models import Alert, AlertSettings, Condition
from alerts.services import CONFIRM_SALT
from figures.leaderboard import FIGURES_CACHE_SECONDS
from figures.stats import stats_rebuild
from nodes.models import Node
from pool.models import NodeRound, Rollout, RolloutText, Verdict
from swarms.services import swarm_default_ensure


def _group(node: Node, rewards: tuple[float, ...], created_at) -> None:
    """An accepted, credited group as the pool stores it (no re-verification: the figures are under test)."""
    rollout = Rollout.objects.create(
        id=uuid.uuid4(),
        node=node,
        swarm=swarm_default_ensure(),
        catalogue_version=1,
        round=1,
        dataset="basic_arithmetic",
        seed=1,
        index=Rollout.objects.count(),
        completion_count=len(rewards),
        claimed_rewards=list(rewards),
        verified_rewards=list(rewards),
        verdict=Verdict.ACCEPTED,
        has_variance=True,
        sampleable=True,
        sample_seq=Rollout.objects.count() + 1,
        created_at=created_at,
    )
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
    page.get_by_label("Email").fill("ada@example.org")
    page.get_by_label("Silent for (minutes)").fill("10")
    page.get_by_role("button", name="Save alerts").click()
    expect(page.locator(".messages")).to_contain_text("Alert settings saved.")
    expect(page.locator(".messages")).to_contain_text("A confirmation link was sent to ada@example.org")
    expect(page.locator("#alert-email-unconfirmed")).to_have_text("Not confirmed")
    expect(page.get_by_label("Email")).to_have_value("ada@example.org")
    expect(page.get_by_label("Silent for (minutes)")).to_have_value("10")

    page.get_by_label("Webhook URL").fill("http://10.0.0.5/hook")
    page.get_by_role("button", name="Save alerts").click()
    expect(page.locator(".messages")).to_contain_text("not public")
    screenshot(page, "me-alerts")


def test_the_owner_of_an_address_confirms_it_from_the_link(live_server, page, user, screenshot):
    """The page the emailed link opens, in a browser that is not logged in: opening it confirms nothing;
    the button does; the same link shows the address confirmed afterwards."""
    AlertSettings.objects.create(user=user, email="ada@example.org")
    link = (
        live_server.url + f"/alerts/confirm/{signing.dumps({'u': user.pk, 'e': 'ada@example.org'}, salt=CONFIRM_SALT)}/"
    )
    page.goto(link)
    expect(page.get_by_role("heading", name="Send node alerts to ada@example.org?")).to_be_visible()
    assert AlertSettings.objects.get(user=user).email_confirmed_at is None
    screenshot(page, "alerts-confirm")
    page.get_by_role("button", name="Confirm this address").click()
    expect(page.locator("#confirm-done")).to_contain_text("Confirmed: alerts about the account's nodes now go to")
    assert AlertSettings.objects.get(user=user).email_confirmed_at is not None
    page.goto(live_server.url + "/alerts/confirm/forged-token/")
    expect(page.locator("#confirm-error")).to_have_text("This confirmation link is not valid.")


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
    expect(chart.locator(".chart-legend")).to_contain_text("Sharing (J > 0)")
    expect(chart.locator(".chart-legend")).to_contain_text("Silo (J = 0)")
    figures = page.locator("#arms-figures")
    expect(figures).to_contain_text("0.667")
    expect(figures).to_contain_text("0.333")
    expect(figures).to_contain_text("+0.333")
    screenshot(page, "swarm-arms")
