"""The site's own pages under its Content-Security-Policy (no inline script, style or eval) in
chromium, and the API docs (Swagger UI) working with every request off the site cut."""

from __future__ import annotations

from factories import make_node
from support.moderation import staff

# Installed before any page script: collects what the browser refused under the policy.
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`);
});
"""

ANONYMOUS = [
    "/",
    "/swarm/",
    "/leaderboard/",
    "/leaderboard/how/",
    "/download/",
    "/accounts/login/",
    "/accounts/signup/",
]
CONTRIBUTOR = ["/me/", "/accounts/password/"]
MODERATOR = ["/moderation/", "/moderation/nodes/", "/moderation/audit/", "/moderation/rules/", "/admin/"]


def watch(page) -> list[str]:
    """Console errors and uncaught exceptions of `page` (a refused inline style is logged there too)."""
    errors: list[str] = []
    page.add_init_script(RECORD_VIOLATIONS)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors


def visit(page, url: str, errors: list[str], *, status: int = 200) -> None:
    response = page.goto(url)
    assert response.status == status, url
    assert "script-src 'self'" in response.headers["content-security-policy"], url
    page.wait_for_load_state("networkidle")  # charts and htmx fragments have loaded
    violations = page.evaluate("window.__csp")
    assert violations == [], (url, violations)
    if status != 200:  # chromium logs the page's own status as a failed load
        errors[:] = [e for e in errors if f"status of {status}" not in e]
    assert errors == [], (url, errors)


def test_every_page_passes_the_content_security_policy(live_server, page, user, login, screenshot):
    errors = watch(page)
    for path in ANONYMOUS:
        visit(page, live_server.url + path, errors)
    visit(page, live_server.url + "/no-such-page/", errors, status=404)
    assert page.locator(".error-page .actions").evaluate("e => getComputedStyle(e).justifyContent") == "center"

    make_node(owner=user, name="laptop")  # the node card draws a chart (data from the JSON API)
    login(page, user)
    for path in CONTRIBUTOR:
        visit(page, live_server.url + path, errors)

    moderator = staff("csp-mod")
    page.context.clear_cookies()
    login(page, moderator)
    for path in MODERATOR:
        visit(page, live_server.url + path, errors)


def test_polling_still_refreshes_without_eval(live_server, page):
    """The live fragments poll with a plain `every 5s` (a trigger filter would need eval)."""
    errors = watch(page)
    visit(page, live_server.url + "/swarm/", errors)
    # The response, not just the request: the server has finished the poll's queries before the
    # test's database is flushed (a poll still running during the flush's TRUNCATE can deadlock it).
    with page.expect_response(lambda r: "/swarm/figures/" in r.url, timeout=12_000):
        pass
    assert page.evaluate("window.__csp") == [] and errors == []
    page.goto("about:blank")  # no further poll


def test_api_docs_render_with_the_network_cut(live_server, page, screenshot):
    outside: list[str] = []

    def only_the_site(route) -> None:
        if route.request.url.startswith(live_server.url + "/"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_the_site)
    errors = watch(page)
    visit(page, live_server.url + "/api/docs/", errors)
    page.wait_for_selector(".opblock-summary-path", timeout=20_000)
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/nodes/" in [p.strip().replace("\u200b", "") for p in paths]
    page.locator(".opblock-summary-path", has_text="/api/v1/pool/stats/").first.click()  # expands
    page.wait_for_selector(".opblock.is-open .responses-wrapper")
    screenshot(page, "api-docs")
    assert outside == []
    assert page.evaluate("window.__csp") == [] and errors == []
