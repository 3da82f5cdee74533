"""The charts' axis labels as a person reads them: every digit of a large figure shown and inside the
picture, never cut by the chart's left margin; and "Last seen" ends its sentence without a stray
space."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from factories import make_node, make_user
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _y_labels(page, selector: str) -> list[dict]:
    """The y-axis labels of the chart in `selector`, bottom to top, with where each is drawn
    relative to the chart's picture (screen pixels)."""
    return page.eval_on_selector(
        selector,
        """box => {
            const svg = box.querySelector("svg").getBoundingClientRect();
            return [...box.querySelectorAll("svg text.y-label")].map(t => {
                const r = t.getBoundingClientRect();
                return {text: t.textContent, left: r.left - svg.left, right: svg.right - r.right};
            });
        }""",
    )


def test_hourly_chart_labels_keep_every_digit_of_figures_over_ten_thousand(live_server, page):
    from figures.models import NodeHour

    owner = make_user(username="erin", display_name="Erin")
    node = make_node(owner=owner, name="big-box", last_seen_at=timezone.now())
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    # The fold's per-hour rows as the scheduled job writes them: a node that earned 12,345.6 in one hour.
    for back, reward in ((2, 2262.92), (1, 12345.6), (0, 565.73)):
        NodeHour.objects.create(
            node=node,
            hour=hour - timedelta(hours=back),
            accepted_groups=100,
            credited_completions=800,
            verified_reward=reward,
        )

    page.goto(live_server.url + "/contributors/erin/")
    chart = ".chart[data-series='curve']"
    expect(page.locator(chart + " svg")).to_be_visible()
    labels = _y_labels(page, chart)

    assert [label["text"] for label in labels] == ["0", "3,086", "6,173", "9,259", "12,346"]
    for label in labels:
        assert label["left"] >= 0, f"{label['text']!r} starts {-label['left']:.1f} px left of the chart"
    assert page.locator("p", has_text="Last seen").first.inner_text().startswith("Last seen just now.")
