"""/download/'s commands in a browser: the machine tabs work from the keyboard, the swarm picker
rewrites the slug in every command in place, and a Copy button (reached with Tab, pressed with Enter)
puts exactly the shown commands on the clipboard, each on its own unbroken line."""

from __future__ import annotations

import re

import pytest
from factories import make_swarm
from playwright.sync_api import expect

from swarms.models import Swarm, SwarmState
from web.install import TORCH_CPU_INDEX

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_tabs_picker_and_copy_from_the_keyboard(live_server, page, screenshot):
    Swarm.objects.update(state=SwarmState.PAUSED)
    make_swarm(slug="easy", title="Easy tasks")
    make_swarm(slug="paper", title="The paper's tasks")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page.goto(live_server.url + "/download/")

    cpu, cuda = page.locator("#install-command-cpu-commands"), page.locator("#install-command-cuda-commands")
    expect(cpu).to_be_visible()
    expect(cuda).to_be_hidden()
    page.get_by_role("tab", name="CPU").focus()
    page.keyboard.press("ArrowRight")
    expect(page.get_by_role("tab", name="NVIDIA GPU")).to_be_focused()
    expect(cuda).to_be_visible()
    expect(cpu).to_be_hidden()
    page.keyboard.press("ArrowLeft")
    expect(cpu).to_be_visible()

    page.get_by_label("Swarm to join").select_option("paper")
    expect(cpu).to_contain_text("--swarm paper --device cpu")
    expect(page.locator("#smollm2-commands")).to_contain_text("--swarm paper --model")

    copy = page.get_by_role("button", name="Copy the CPU commands")
    copy.focus()
    page.keyboard.press("Enter")
    expect(copy).to_have_text("Copied")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == cpu.inner_text().strip()
    lines = copied.split("\n")
    assert lines[1] == f"pip install torch==2.13.0 --index-url {TORCH_CPU_INDEX}"
    assert lines[3].startswith("SAPO_TOKEN=YOUR_NODE_TOKEN sapo-node run --server ws://")
    assert lines[3].endswith("--swarm paper --device cpu")
    # Shown as it copies: no line of the block wraps (it scrolls sideways instead).
    assert cpu.evaluate("e => getComputedStyle(e).whiteSpace") == "pre"
    page.set_viewport_size({"width": 600, "height": 800})
    assert cpu.evaluate("e => e.scrollWidth > e.clientWidth")  # on a narrow screen the long lines scroll
    screenshot(page, "download-commands")


def test_copy_works_on_a_plain_http_site_too(live_server, page):
    """A site served over plain http to other machines is no secure context: no Clipboard API there.
    The button then copies through a selection (or leaves the text selected and says to press Ctrl+C)."""
    insecure = live_server.url.replace("127.0.0.1", "0.0.0.0")
    page.goto(insecure + "/download/")
    assert page.evaluate("window.isSecureContext") is False
    block = page.locator("#install-command-cpu-commands")
    page.get_by_role("button", name="Copy the CPU commands").click()
    button = page.get_by_role("button", name="Copy the CPU commands")
    expect(button).to_have_text(re.compile(r"^(Copied|Press Ctrl\+C)$"))
    if button.inner_text() == "Press Ctrl+C":
        assert page.evaluate("String(window.getSelection())").strip() == block.inner_text().strip()
    else:
        # What the copy put on the clipboard comes back with a paste.
        page.evaluate(
            "() => { const a = document.createElement('textarea'); a.id = 'paste'; document.body.appendChild(a); }"
        )
        page.locator("#paste").focus()
        page.keyboard.press("Control+V")
        assert page.locator("#paste").input_value() == block.inner_text().strip()
