"""The moderation queue in a real browser: hostile completions are shown as text, and an htmx action
updates one group in place without reloading the page."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from factories import make_node
from support.moderation import group, share, staff

HOSTILE = (
    "<script>window.__pwned = 1; alert(1)</script>"
    '<img id="injected" src=x onerror="window.__pwned = 2">'
    "<b id='bold'>bold</b> & done"
)


def _in_thread(work):
    from django.db import connections

    try:
        return work()
    finally:
        connections.close_all()  # this thread's connection, or the test database cannot be dropped


def test_hostile_completion_is_text_and_actions_swap_in_place(live_server, page, login, screenshot):
    g = group(9)
    hostile = group(9, completions=[f"{HOSTILE} <answer>{g['answer']}</answer>", "no"])
    # In a thread: sharing announces on the channel layer (async_to_sync), which refuses to run on
    # the thread where Playwright's event loop lives.
    with ThreadPoolExecutor(1) as pool:
        (row,) = pool.submit(_in_thread, lambda: share(make_node(name="hostile"), hostile)).result()
    moderator = staff("browser-mod")
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    login(page, moderator)

    page.goto(f"{live_server.url}/moderation/?status=any")
    card = page.locator(f"#group-{row.id}")
    completion = card.locator("pre.completion").first
    assert HOSTILE in completion.inner_text()
    assert page.locator("#injected").count() == 0 and page.locator("#bold").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert dialogs == []
    screenshot(page, "moderation-queue")

    page.evaluate("window.__still_here = true")
    card.locator("input[name=reason]").fill("hostile markup")
    card.get_by_role("button", name="Quarantine").click()
    page.locator(f"#group-{row.id} .status", has_text="Quarantined").wait_for()
    assert page.evaluate("window.__still_here") is True  # swapped by htmx, not reloaded
    row.refresh_from_db()
    assert row.moderation_status == "quarantined"

    page.goto(f"{live_server.url}/moderation/audit/")
    assert page.get_by_role("cell", name="hostile markup").is_visible()
    screenshot(page, "moderation-audit")
