"""The staff pages and /teams/'s search in the site's look, measured in the browser: every button and
field styled as the rest of the site (no browser-default control), the queue's Filter on its fields'
bottom line, the date fields as tall as the others, /teams/'s Search button attached to its box."""

from __future__ import annotations

import pytest
from factories import make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

#: Buttons and fields in a page's main part that keep the browser's own look (no border radius, the
#: system's grey button face): each one found, described.
UNSTYLED = r"""() => [...document.querySelectorAll("main button, main input, main select, main textarea")]
  .filter(e => e.type !== "hidden" && e.type !== "checkbox" && e.type !== "radio" && e.getBoundingClientRect().width > 0)
  .filter(e => {
    const s = getComputedStyle(e);
    const round = Math.max(...["TopLeft", "TopRight", "BottomLeft", "BottomRight"].map(c => parseFloat(s["border" + c + "Radius"])));
    return round < 4 && e.getAttribute("role") !== "tab";
  })
  .map(e => e.tagName.toLowerCase() + "[name=" + (e.name || "") + "] " + (e.innerText || e.type || "").trim().slice(0, 30))"""


def _box(page, selector: str) -> dict:
    return page.locator(selector).first.evaluate(
        "e => { const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, height: r.height}; }"
    )


def test_staff_pages_use_the_sites_controls(live_server, page, login):
    login(page, make_user(username="operator", is_staff=True))
    for path in ("/moderation/", "/moderation/nodes/", "/moderation/audit/", "/moderation/rules/", "/swarms/new/"):
        page.goto(live_server.url + path)
        assert page.evaluate(UNSTYLED) == [], path

    page.goto(live_server.url + "/moderation/")
    button = _box(page, ".filters button")
    until = _box(page, "#id_until")
    status = _box(page, "#id_status")
    assert abs(button["bottom"] - until["bottom"]) <= 2, (button, until)  # Filter on the fields' bottom line
    assert abs(until["height"] - status["height"]) <= 2  # a date field as tall as a select


def test_the_team_search_has_its_button_attached(live_server, page):
    page.goto(live_server.url + "/teams/")
    assert page.evaluate(UNSTYLED) == []
    field, button = _box(page, "#team-search"), _box(page, ".search-row button")
    assert 0 <= button["left"] - field["right"] <= 1  # touching, on the same line
    assert abs(button["top"] - field["top"]) <= 1 and abs(button["height"] - field["height"]) <= 1
