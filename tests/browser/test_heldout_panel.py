"""In a real browser: a swarm page's "Held-out accuracy" panel (sharing nodes against silo nodes, with
Wilson intervals, over time) and a node page's own held-out checks, read from stored check scores."""

from __future__ import annotations

from datetime import timedelta

from django.core.cache import cache
from django.utils import timezone
from factories import make_credited_group, make_node
from playwright.sync_api import expect

from figures.heldout import wilson
from figures.leaderboard import FIGURES_CACHE_SECONDS
from figures.stats import stats_rebuild
from nodes.models import Node
from pool.models import HeldoutScore, NodeRound
from swarms.models import Swarm
from swarms.services import swarm_default_ensure


def _sharer_and_loner(*, report_round: int) -> tuple[Swarm, Node, Node]:
    """Two credited nodes of the default swarm whose report of `report_round` puts one in each arm: "sharer"
    trained on others' groups, "loner" on its own only."""
    swarm = swarm_default_ensure()
    sharer, loner = make_node(name="sharer"), make_node(name="loner")
    for node, external in ((sharer, 4), (loner, 0)):
        make_credited_group(node)
        NodeRound.objects.create(
            node=node, swarm=swarm, round=report_round, figures={"external": external}, used_count=0
        )
    return swarm, sharer, loner


def test_the_swarm_page_and_a_node_page_show_held_out_accuracy(live_server, page, screenshot):
    swarm, sharer, loner = _sharer_and_loner(report_round=30)
    now = timezone.now()
    for i, (shared, alone) in enumerate(((3.0, 1.0), (3.0, 2.0), (4.0, 2.0))):
        at = now - timedelta(minutes=20 - 10 * i)
        for node, score in ((sharer, shared), (loner, alone)):
            HeldoutScore.objects.create(
                node=node, swarm=swarm, round=10 * (i + 1), questions=4, score=score, asked_at=at, answered_at=at
            )
    stats_rebuild()
    cache.clear()
    page.wait_for_timeout(1000 * FIGURES_CACHE_SECONDS + 500)  # the server's own cache of an earlier page

    page.goto(f"{live_server.url}/swarms/{swarm.slug}/")
    panel = page.locator("#heldout-panel")
    expect(panel.locator("h2")).to_have_text("Held-out accuracy: swarm against silo")
    low, high = wilson(10.0, 12)
    sharing = panel.locator("#heldout-sharing")
    expect(sharing).to_contain_text("83.3%")  # 10 of 12 answers right
    expect(sharing).to_contain_text(f"95% interval {100 * low:.1f}% to {100 * high:.1f}%")
    expect(sharing).to_contain_text("12 answers · 1 node")
    expect(panel.locator("#heldout-silo")).to_contain_text("41.7%")  # 5 of 12
    rows = panel.locator("#heldout-curve tbody tr")
    expect(rows).to_have_count(3)  # one span per check here: 20 minutes cut into six
    expect(rows.nth(0).locator("td").nth(1)).to_contain_text("75%")
    expect(rows.nth(2).locator("td").nth(1)).to_contain_text("100%")
    expect(rows.nth(2).locator("td").nth(2)).to_contain_text("50%")
    screenshot(page, "swarm-heldout")

    page.goto(f"{live_server.url}/nodes/{sharer.id}/")
    mine = page.locator("#node-heldout")
    expect(mine.locator("#node-heldout-total")).to_have_text("83.3%")
    expect(mine.locator("#node-heldout-checks tbody tr")).to_have_count(3)
    expect(mine.locator("#node-heldout-checks tbody tr").first).to_contain_text("30")  # newest first: round 30


def test_an_arm_without_enough_answers_says_so(live_server, page):
    swarm, sharer, loner = _sharer_and_loner(report_round=3)
    at = timezone.now()
    HeldoutScore.objects.create(node=sharer, swarm=swarm, round=3, questions=4, score=2.0, asked_at=at, answered_at=at)
    stats_rebuild()
    cache.clear()
    page.wait_for_timeout(1000 * FIGURES_CACHE_SECONDS + 500)
    page.goto(f"{live_server.url}/swarms/{swarm.slug}/")
    expect(page.locator("#heldout-sharing")).to_contain_text("not enough data yet")
    expect(page.locator("#heldout-sharing")).to_contain_text("4 answers so far; a figure needs 8")
    expect(page.locator("#heldout-silo")).to_contain_text("0 answers so far")
