"""Every public page and every staff page at a phone's, a tablet's and a laptop's width (360, 768 and
1280 px): no element's content runs past its card, its table cell or the page (scrollWidth over
clientWidth, except in an element that scrolls on purpose: a command block, a wide table's own
scroller), no name or figure broken inside a word, and no text that reads as negative zero ("-0",
"-0.00", "−0.0%"), in the page's text or in its charts.

The site is filled as a newcomer meets it: two open swarms (one of them with datasets of long names),
contributors and nodes with long names, figures that round to zero from below, a team, a held group
in the moderation queue."""

from __future__ import annotations

import pytest
from django.utils import timezone
from factories import make_credited_group, make_node, make_swarm, make_user

from community.models import Badge
from community.services import team_found, team_join
from nodes.models import Node
from pool.models import ModerationStatus, NodeRound, Rollout, RolloutText
from swarms.models import Swarm
from swarms.services import swarm_default_ensure

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (360, 768, 1280)

#: Run in the page: what a person would see cut, broken or misread. Returns a list of findings.
CHECK = r"""() => {
  const found = [];
  const where = el => {
    const id = el.id ? "#" + el.id : "";
    const cls = el.className && typeof el.className === "string" ? "." + el.className.trim().split(/\s+/).join(".") : "";
    return el.tagName.toLowerCase() + id + cls + ' "' + (el.innerText || el.textContent || "").trim().slice(0, 40) + '"';
  };
  const visible = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  const scrolls = el => /(auto|scroll)/.test(getComputedStyle(el).overflowX);
  const insideScroller = el => { for (let p = el.parentElement; p; p = p.parentElement) if (scrolls(p)) return true; return false; };

  if (document.documentElement.scrollWidth > document.documentElement.clientWidth + 1)
    found.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " px in " + document.documentElement.clientWidth);
  // Cards, figures, table cells and the boxes that hold them.
  const boxes = "main .card, main .stat, main td, main th, main dd, main .table-wrap, main .empty, main .hero, main form, main section, main article, main li";
  for (const el of document.querySelectorAll(boxes)) {
    if (!visible(el) || scrolls(el) || insideScroller(el)) continue;
    if (el.scrollWidth > el.clientWidth + 1) {
      // Name the innermost element that reaches furthest past the box's right edge: what to fix.
      const edge = el.getBoundingClientRect().right;
      let culprit = null, reach = edge + 1;
      for (const child of el.querySelectorAll("*")) {
        const r = child.getBoundingClientRect();
        if (r.width > 0 && r.right >= reach) { culprit = child; reach = r.right; }
      }
      found.push("overflows its box by " + (el.scrollWidth - el.clientWidth) + " px: " + where(el) + (culprit ? ", past its edge: " + where(culprit) : ""));
    }
  }
  // A wide table may scroll in its wrapper on a phone, never on a laptop.
  if (window.innerWidth >= 1024)
    for (const el of document.querySelectorAll("main .table-wrap"))
      if (visible(el) && el.scrollWidth > el.clientWidth + 1) found.push("table cut at the card's edge: " + where(el));
  // Names, "3 nodes", times and badges stay on one line; so does any cell or figure of one word (no
  // "local-" / "2", no "smollm2-" / "135m").
  const oneLine = "main .name, main .name-cell > .muted, main time, main .badge, main a.btn";
  const oneWord = "main td, main dd, main td > *, main dd > *, main h1, main h2, main h3";
  for (const el of document.querySelectorAll(oneLine + ", " + oneWord)) {
    if (!visible(el) || insideScroller(el)) continue;
    const text = (el.innerText || "").trim();
    if (!text || (!el.matches(oneLine) && /\s/.test(text))) continue;
    // The text's own line boxes (not its elements' boxes, which a badge or an inline-block offsets):
    // a rectangle that starts below the previous one's bottom is a new line.
    const rects = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      if (!node.textContent.trim()) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      for (const r of range.getClientRects()) if (r.width > 0) rects.push(r);
    }
    rects.sort((a, b) => a.top - b.top);
    let lines = 0, bottom = -Infinity;
    for (const r of rects) { if (r.top >= bottom - 2) lines++; bottom = Math.max(bottom, r.bottom); }
    if (lines > 1) found.push("broken inside a word: " + where(el));
  }
  // A chart's labels inside its picture (no dataset name losing its first letters or its end).
  for (const svg of document.querySelectorAll("main .chart svg")) {
    const box = svg.getBoundingClientRect();
    for (const t of svg.querySelectorAll("text")) {
      const r = t.getBoundingClientRect();
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.bottom > box.bottom + 1 || r.top < box.top - 1)
        found.push("chart label cut by its picture's edge: " + JSON.stringify(t.textContent));
    }
  }
  // Negative zero, in the text and in the charts' labels and tooltips.
  const texts = [document.body.innerText];
  for (const t of document.querySelectorAll("svg text, svg title")) texts.push(t.textContent);
  for (const text of texts) {
    for (const m of text.matchAll(/(?<![\w.\-\u2212])[-\u2212]\d[\d,]*(?:\.\d+)?%?/g)) {
      if (!/[1-9]/.test(m[0])) found.push("negative zero: " + JSON.stringify(text.slice(Math.max(0, m.index - 30), m.index + 12)));
    }
  }
  return found;
}"""


def _group(node: Node, swarm: Swarm, rewards: tuple[float, ...], dataset: str, **fields) -> Rollout:
    """One accepted group, counted in the figures (so the charts draw their dataset labels)."""
    now = timezone.now()
    rollout = make_credited_group(node, rewards, now, swarm=swarm, dataset=dataset, sampleable=False, **fields)
    RolloutText.objects.create(
        rollout=rollout,
        swarm_id=swarm.id,
        created_at=now,
        question="What is the day of the week 1,000 days after 2024-02-29?",
        answer="Tuesday",
        completions=["<answer>Tuesday</answer>", "<answer>Monday</answer>"][: len(rewards)] + [""] * (len(rewards) - 2),
    )
    Node.objects.filter(id=node.id).update(last_seen_at=now, model_id="smollm2-135m", hardware="cpu x2")
    return rollout


@pytest.fixture
def site():
    """The site a newcomer walks into after `make run`, with the names and figures that broke pages."""
    main = swarm_default_ensure()
    Swarm.objects.filter(id=main.id).update(description="The nodes `make run` starts on this machine train here.")
    calendar = make_swarm(slug="calendar", title="Calendar and long dataset names", catalogue="sapo")
    owner = make_user(username="bartholomew-maximilian", display_name="Bartholomew Maximilian-Featherstonehaugh")
    local_2 = make_node(owner=owner, name="local-2")
    long_node = make_node(owner=owner, name="a-rather-long-node-name-for-a-laptop-42")
    for node in (local_2, long_node):
        _group(node, main, (1.0, 0.0), "basic_arithmetic")
        _group(node, calendar, (0.5, 0.25), "calendar_arithmetic")
        _group(node, calendar, (1.0, 0.0), "propositional_logic")
        NodeRound.objects.create(
            node=node, swarm=main, round=1, figures={"external": 4, "reward_mean": -0.0001}, used_count=0
        )
    # Figures that round to zero from below: a reward of -0.0001 shows as 0.000, never -0.000.
    newcomer = make_user(username="newcomer", display_name="Newcomer")
    tiny = make_node(owner=newcomer, name="silo-1")
    _group(tiny, main, (-0.0001, -0.0002), "basic_arithmetic")
    _group(tiny, calendar, (-0.0001, 0.0), "calendar_arithmetic", moderation_status=ModerationStatus.HELD)
    team = team_found(
        founder=newcomer, name="A new team with a longish name", description="Just founded.", address="127.0.0.1"
    )
    team_join(user=owner, team=team)
    # Badges beside a name: "2 nodes" keeps its line under them.
    for kind in ("top1", "first_group", "groups_1k", "first_helped"):
        Badge.objects.create(user=owner, kind=kind)
    staff = make_user(username="operator", display_name="Operator", is_staff=True)
    return {"owner": owner, "node": long_node, "newcomer": newcomer, "team": team, "staff": staff}


def _pages(site) -> dict[str, list[str]]:
    public = [
        "/",
        "/download/",
        "/leaderboard/",
        "/leaderboard/?view=nodes",
        "/leaderboard/?view=teams",
        "/leaderboard/how/",
        "/swarm/",
        "/swarms/",
        "/swarms/main/",
        "/swarms/calendar/",
        f"/contributors/{site['owner'].username}/",
        f"/contributors/{site['newcomer'].username}/",
        f"/nodes/{site['node'].id}/",
        "/stats/",
        "/teams/",
        f"/teams/{site['team'].slug}/",
        "/accounts/login/",
        "/accounts/signup/",
        "/accounts/password_reset/",
    ]
    contributor = ["/me/", "/accounts/password/"]
    staff = [
        "/moderation/",
        "/moderation/?status=any",
        "/moderation/nodes/",
        "/moderation/audit/",
        "/moderation/rules/",
        "/swarms/new/",
        "/swarms/main/manage/",
    ]
    return {"anonymous": public, "newcomer": contributor, "staff": staff}


def _settle(page) -> None:
    """Charts drawn (or said empty) and the fonts in: what a person sees a second after the load."""
    page.wait_for_function(
        """() => [...document.querySelectorAll("[data-chart]")].every(c => c.dataset.drawn || !/Loading/.test(c.textContent))""",
        timeout=15_000,
    )
    page.evaluate("document.fonts.ready")


def test_every_page_at_three_widths_shows_every_figure_whole(live_server, browser, login, site, screenshot):
    problems: list[str] = []
    for who, paths in _pages(site).items():
        for width in WIDTHS:
            context = browser.new_context(viewport={"width": width, "height": 900})
            context.set_default_timeout(15_000)
            page = context.new_page()
            if who != "anonymous":
                login(page, site["staff"] if who == "staff" else site["newcomer"])
            for path in paths:
                response = page.goto(live_server.url + path)
                assert response is not None and response.status == 200, (
                    f"{path} as {who}: {response and response.status}"
                )
                _settle(page)
                for finding in page.evaluate(CHECK):
                    problems.append(f"{path} at {width} px ({who}): {finding}")
                if width == 360 or width == 1280:
                    name = path.strip("/").replace("/", "-").replace("?", "-").replace("=", "-") or "home"
                    screenshot(page, f"width-{width}-{name}")
            if who == "newcomer":
                # The token box, as the answer to adding a node shows it (commands and all).
                page.goto(live_server.url + "/me/")
                page.get_by_label("Node name").fill(f"box-{width}")
                page.get_by_role("button", name="Add node").click()
                page.locator("#token-value").wait_for()
                _settle(page)
                for finding in page.evaluate(CHECK):
                    problems.append(f"/me/ token box at {width} px: {finding}")
                screenshot(page, f"width-{width}-me-token")
            context.close()
    assert not problems, "\n".join(problems)
