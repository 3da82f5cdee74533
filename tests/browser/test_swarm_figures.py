"""A visitor picks a swarm on the leaderboard: the table shows that swarm's figures, keeps them when it
refreshes itself, and "All swarms" brings the site's totals back."""

from __future__ import annotations

import pytest
from django.utils import timezone
from factories import make_credited_group, make_node, make_swarm, make_user
from playwright.sync_api import expect

from nodes.models import Node
from pool.models import RolloutText
from swarms.services import swarm_default_ensure

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _group(node: Node, swarm, rewards: tuple[float, ...]) -> None:
    """One accepted group of `node` in `swarm`, stored as the pool stores it (no re-verification)."""
    now = timezone.now()
    rollout = make_credited_group(node, rewards, now, swarm=swarm, has_variance=False, sampleable=False)
    RolloutText.objects.create(
        rollout=rollout,
        swarm_id=swarm.id,
        created_at=now,
        question="What is 1 + 1?",
        answer="2",
        completions=["<answer>2</answer>"] * len(rewards),
    )
    Node.objects.filter(id=node.id).update(last_seen_at=now)


def test_the_leaderboard_switches_between_swarms(live_server, page, screenshot):
    main = swarm_default_ensure()
    hard = make_swarm(slug="hard", title="Hard tasks")
    owner = make_user(username="dana", display_name="Dana")
    both, only_hard = make_node(owner=owner, name="both-swarms"), make_node(owner=owner, name="hard-only")
    _group(both, main, (1.0, 1.0, 1.0))
    _group(both, hard, (0.5, 0.5))
    _group(only_hard, hard, (0.25, 0.25))

    page.goto(live_server.url + "/leaderboard/?view=nodes")
    rows = page.locator("#leaderboard tbody tr")
    expect(rows).to_have_count(2)
    reward_of_both = page.locator("#leaderboard tbody tr", has_text="both-swarms").locator(
        "[data-figure='verified_reward']"
    )
    expect(reward_of_both).to_have_text("4.0")

    page.locator("#swarm-picker").get_by_role("link", name="Hard tasks").click()
    expect(page).to_have_url(live_server.url + "/leaderboard/?view=nodes&swarm=hard")
    expect(page.locator("#board-swarm")).to_have_text("Hard tasks")
    expect(reward_of_both).to_have_text("1.0")
    expect(rows).to_have_count(2)
    # The table refreshes itself every few seconds: it keeps the swarm.
    with page.expect_response(lambda r: "/leaderboard/table/" in r.url) as refreshed:
        pass
    assert "swarm=hard" in refreshed.value.url
    expect(reward_of_both).to_have_text("1.0")
    screenshot(page, "leaderboard-swarm")

    page.locator("#swarm-picker").get_by_role("link", name=main.title).click()
    expect(rows).to_have_count(1)
    expect(reward_of_both).to_have_text("3.0")
    page.locator("#swarm-picker").get_by_role("link", name="All swarms").click()
    expect(reward_of_both).to_have_text("4.0")
