"""The community's "done when" path through a real browser and a live server (HTTP + WebSockets):
a contributor founds a team and shares groups over the node protocol, another joins it, the team
shows on /teams/ and the leaderboard's teams tab with its credit, the public pages exist and are
linked from the leaderboard, the scheduled command assigns badges and writes the export that /stats/
serves, and a private profile is anonymous everywhere.

The server runs with an export folder of this test's own (asgi_server's settings), so the export it
serves is the one this test's scheduled command writes.
"""

from __future__ import annotations

import gzip
import json
from contextlib import ExitStack

import pytest
from django.core.management import call_command
from factories import make_node_with_token, make_user
from playwright.sync_api import expect
from support.audits import mark_audited
from test_web_journey import WireNode

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _login(page, user, url: str) -> None:
    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    page.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie.value, "url": url}])


def _reload_until(page, locator, text: str, *, seconds: int = 30) -> None:
    """Reload until `locator` shows `text`: a page without live updates whose figures are cached."""
    for _ in range(seconds):
        if locator.count() and locator.inner_text() == text:
            return
        page.wait_for_timeout(1000)
        page.reload()
    expect(locator).to_have_text(text)


def test_found_join_credit_pages_badges_export_and_privacy(
    asgi_server, browser, settings, tmp_path, screenshot, in_thread
):
    export_dir = tmp_path / "stats"
    settings.SAPO_STATS_EXPORT_DIR = export_dir
    carol = make_user(username="carol", display_name="Carol")
    dave = make_user(username="dave", display_name="Dave")
    node, token = make_node_with_token(owner=carol, name="laptop")

    with asgi_server(settings={"SAPO_STATS_EXPORT_DIR": export_dir}) as server, ExitStack() as sockets:
        base = server.url
        founder = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
        founder.context.set_default_timeout(15_000)
        _login(founder, carol, base)

        # Carol founds a team on /teams/.
        founder.goto(base + "/teams/")
        founder.get_by_label("Team name").fill("Night Owls")
        founder.get_by_label("Short description").fill("We train while the city sleeps.")
        founder.get_by_role("button", name="Found team").click()
        expect(founder.get_by_role("heading", name="Night Owls")).to_be_visible()
        assert founder.url == base + "/teams/night-owls/"

        # Her node shares over the real protocol: the team's credit counts from now on.
        wire = WireNode(sockets, server.ws_url, token)
        assert wire.hello()["type"] == "welcome"
        assert len(wire.share([wire.group(), wire.group(), wire.group()])["accepted"]) == 3
        mark_audited(node)  # credit is audited work: as if the node's first audit passed

        # Dave joins it from its page.
        joiner = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
        joiner.context.set_default_timeout(15_000)
        _login(joiner, dave, base)
        joiner.goto(base + "/teams/night-owls/")
        joiner.get_by_role("button", name="Join team").click()
        expect(joiner.get_by_text("You joined Night Owls.")).to_be_visible()
        expect(joiner.locator('#member-table tr[data-member="Dave"]')).to_be_visible()
        reward = joiner.locator('#team-figures [data-figure="verified_reward"]')
        for _ in range(30):  # the team's credit is cached for seconds
            if reward.inner_text() != "0.0":
                break
            joiner.wait_for_timeout(1000)
            joiner.reload()
        expect(reward).not_to_have_text("0.0")
        screenshot(joiner, "team")

        # The team on /teams/ and on the leaderboard's teams tab, with its credit.
        joiner.goto(base + "/teams/")
        row = joiner.locator('#team-table tr[data-team="night-owls"]')
        expect(row.locator('[data-figure="members"]')).to_have_text("2")  # read on every request
        _reload_until(joiner, row.locator('[data-figure="accepted"]'), "3")  # credit: cached for seconds
        screenshot(joiner, "teams")
        joiner.goto(base + "/leaderboard/")
        joiner.get_by_role("link", name="Teams", exact=True).last.click()
        team_row = joiner.locator('#leaderboard tr[data-team="night-owls"]')
        expect(team_row.locator('[data-figure="accepted"]')).to_have_text("3", timeout=25_000)

        # Leaderboard rows lead to the public pages.
        joiner.goto(base + "/leaderboard/")
        joiner.locator("#leaderboard").get_by_role("link", name="Carol").click()
        expect(joiner.get_by_role("heading", name="Carol")).to_be_visible()
        expect(joiner.locator('#profile-figures [data-figure="accepted"]')).to_have_text("3")
        expect(joiner.get_by_role("link", name="Night Owls")).to_be_visible()
        joiner.locator("#profile-nodes").get_by_role("link", name="laptop").click()
        expect(joiner.get_by_role("heading", name="laptop")).to_be_visible()
        expect(joiner.get_by_text("tiny-test")).to_be_visible()  # self-reported in its hello

        # The scheduled command assigns badges and writes the export.
        in_thread(call_command, "sapo_scheduled")
        joiner.goto(base + "/contributors/carol/")
        expect(joiner.locator("h1 .badge-first_group")).to_be_visible()
        # A new account ranks only once established (docs/community.md#badges).
        expect(joiner.locator("h1 .badge-top1")).to_have_count(0)
        screenshot(joiner, "contributor")
        joiner.goto(base + "/stats/")
        joiner.get_by_role("link", name="contributors.json.gz").wait_for()
        download = joiner.request.get(base + "/stats/contributors.json.gz")
        assert download.ok and download.headers["content-type"] == "application/gzip"
        rows = json.loads(gzip.decompress(download.body()))["rows"]
        assert [(r["id"], r["name"], r["page"]) for r in rows] == [(carol.id, "Carol", "/contributors/carol/")]
        screenshot(joiner, "stats-export")

        # Carol makes her profile private: anonymous everywhere, her pages gone for others.
        founder.goto(base + "/me/")
        founder.get_by_role("button", name="Make my profile private").click()
        expect(founder.get_by_text("Your profile is private")).to_be_visible()
        joiner.goto(base + "/leaderboard/")
        expect(joiner.locator("#leaderboard")).to_contain_text("anonymous", timeout=25_000)
        expect(joiner.locator("#leaderboard")).not_to_contain_text("Carol")
        assert joiner.goto(base + "/contributors/carol/").status == 404
        assert joiner.goto(base + f"/nodes/{node.id}/").status == 404
        joiner.goto(base + "/teams/night-owls/")
        expect(joiner.locator("#member-table")).to_contain_text("anonymous")
        expect(joiner.locator("#member-table")).not_to_contain_text("Carol")
        # ... and gone from the published export at once, not at the next one.
        download = joiner.request.get(base + "/stats/contributors.json.gz")
        assert json.loads(gzip.decompress(download.body()))["rows"] == []

        # The founder disbands the team, after saying yes to the question.
        asked = []
        founder.on("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
        founder.goto(base + "/teams/night-owls/")
        founder.get_by_role("button", name="Disband team").click()
        expect(founder.get_by_text("Night Owls is disbanded.")).to_be_visible()
        assert asked == ["Disband Night Owls? Every member leaves it."]
        assert joiner.goto(base + "/teams/night-owls/").status == 404
        founder.context.close()
        joiner.context.close()
