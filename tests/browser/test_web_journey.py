"""A new contributor's whole journey through a real browser and a live server (HTTP + WebSockets):
landing page -> sign up -> add a node -> token shown once -> download and install the wheel -> a
node connects and shares -> /me/ and the leaderboard show it without a reload -> revoke.

The node is driven through the real WebSocket protocol with valid shares built by sapo_node.tasks
(a full `sapo-node run` trains a model: too slow for this suite; the node client's own tests cover it).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest
from factories import make_node_with_token, make_user
from playwright.sync_api import expect
from support.audits import mark_audited
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from nodes.models import Node
from sapo_node.ids import uuid7
from sapo_node.tasks import build_entry, score_completion
from swarms.selectors import swarm_place
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.browser


class WireNode:
    """A node speaking protocol v1 over a real socket."""

    def __init__(self, stack: ExitStack, ws_url: str, token: str) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self.ws = stack.enter_context(connect(ws_url + "/ws/node/", additional_headers=headers))
        self.catalogue = swarm_place(swarm=swarm_default_ensure()).catalogue  # what its hello gets
        self.index = 0

    def call(self, frame: dict) -> dict:
        self.ws.send(json.dumps({"v": 1, **frame}))
        return json.loads(self.ws.recv(timeout=20))

    def hello(self) -> dict:
        return self.call({"type": "hello", "client": "sapo-node/test", "model": "tiny-test", "hardware": "cpu x2"})

    def group(self, *, honest: bool = True) -> dict:
        spec = self.catalogue.get("basic_arithmetic")
        seed, self.index = 1234, self.index + 1
        entry = build_entry(spec, seed, self.index)
        completions = [f"<answer>{entry['answer']}</answer>", "<answer>not it</answer>"]
        rewards = [score_completion(spec, seed, entry, c) for c in completions]
        if not honest:
            rewards = [1.0, 1.0]  # claims the wrong answer is right: reward_mismatch
        return {
            "id": str(uuid7()),
            "round": 1,
            "task": {"dataset": spec.dataset, "seed": seed, "index": self.index},
            "question": entry["question"],
            "answer": entry["answer"],
            "completions": completions,
            "rewards": rewards,
        }

    def share(self, groups: list[dict]) -> dict:
        return self.call({"type": "share", "rollouts": groups})


def _cell(page, node: str, figure: str):
    return page.locator(f'#node-table tr[data-node="{node}"] [data-figure="{figure}"]')


def test_new_contributor_journey(live_server, page, screenshot, tmp_path: Path):
    base = live_server.url
    page.on("dialog", lambda dialog: dialog.accept())  # hx-confirm asks before revoking

    # Landing page: what the swarm is and how to join.
    page.goto(base + "/")
    expect(page.get_by_role("heading", name="Language models that learn together")).to_be_visible()
    expect(page.get_by_role("heading", name="How to join")).to_be_visible()
    screenshot(page, "home")

    # Sign up, with the keyboard-usable labelled form.
    page.get_by_role("link", name="Join the swarm").click()
    page.get_by_label("Username").fill("carol")
    page.get_by_label("Display name").fill("Carol")
    page.locator("#id_password1").fill("a-long-test-passphrase-42")
    page.locator("#id_password2").fill("a-long-test-passphrase-42")
    screenshot(page, "signup")
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("banner").get_by_role("link", name="Carol")).to_be_visible()

    # Sign-up lands on /me/, saying what comes next. Add a node: empty state first, then the token,
    # shown once with the commands for each kind of machine.
    expect(page.get_by_role("status")).to_contain_text("Welcome, Carol. Next: add a node below.")
    page.get_by_role("status").get_by_role("link", name="add a node").click()
    expect(page.get_by_text("No nodes yet: here is how to add one")).to_be_visible()
    screenshot(page, "me-empty")
    page.get_by_label("Node name").fill("laptop")
    page.keyboard.press("Enter")  # the form works from the keyboard
    token = page.locator("#token-value").inner_text().strip()
    assert token.startswith("sapo_")
    # The CPU tab is shown first; its block's Copy button copies the commands exactly as shown.
    command = page.locator("#token-command-cpu-commands").inner_text()
    assert re.search(
        rf"pip install transformers==[\d.]+ {re.escape(base)}/download/[0-9a-f]{{16}}/sapo_node-[\w.]+-py3-none-any\.whl\n"
        rf"SAPO_TOKEN={re.escape(token)} sapo-node run --server {re.escape(live_server.ws_url)}/ws/node/",
        command,
    ), command
    expect(page.locator("#token-command-cuda-commands")).to_be_hidden()
    page.get_by_role("tab", name="NVIDIA GPU").click()
    expect(page.locator("#token-command-cuda-commands")).to_be_visible()
    expect(page.locator("#token-command-cpu-commands")).to_be_hidden()
    screenshot(page, "me-token-once")
    expect(page.locator('#node-table tr[data-node="laptop"] [data-status]')).to_have_text("offline")
    # The token came in the answer to the form post; the address bar says /me/, so a reload asks for
    # /me/ (no second post, no "name taken") and the token is gone.
    expect(page).to_have_url(re.compile(r"/me/#new-token$"))
    page.reload()
    expect(page.locator("#token-value")).to_have_count(0)
    assert token not in page.content() and "already have a node" not in page.content()

    # Download the wheel: checksum as shown, installs into a fresh venv, console script runs.
    page.goto(base + "/download/")
    shown_sha = page.locator("#wheel-sha256").inner_text().strip()
    screenshot(page, "download")
    with page.expect_download() as info:
        page.get_by_role("link", name="Download the wheel").click()
    wheel = tmp_path / info.value.suggested_filename
    info.value.save_as(wheel)
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == shown_sha
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        check=True,
    )
    helped = subprocess.run([str(venv / "bin" / "sapo-node"), "--help"], capture_output=True, text=True, check=True)
    assert "usage: sapo-node" in helped.stdout and "run" in helped.stdout

    # The node connects: /me/ shows it online within seconds, without a reload.
    page.goto(base + "/me/")
    page.evaluate("window.__noReload = true")
    with ExitStack() as sockets:
        node = WireNode(sockets, live_server.ws_url, token)
        assert node.hello()["type"] == "welcome"
        expect(page.locator('#node-table tr[data-node="laptop"] [data-status]')).to_have_text("online", timeout=15_000)
        ack = node.share([node.group(), node.group(), node.group(honest=False)])
        assert len(ack["accepted"]) == 2 and ack["rejected"][0]["reason"] == "reward_mismatch"
        expect(_cell(page, "laptop", "accepted")).to_have_text("2", timeout=20_000)
        expect(_cell(page, "laptop", "rejected")).to_have_text("1")
        assert page.evaluate("window.__noReload") is True

        # Another contributor's node trains on Carol's groups: helpfulness.
        _, other_token = make_node_with_token(owner=make_user(username="dave", display_name="Dave"), name="rig")
        other = WireNode(sockets, live_server.ws_url, other_token)
        other.hello()
        other.share([other.group()])
        sampled = other.call({"type": "sample", "n": 4})["rollouts"]
        assert {r["node"] for r in sampled} == {"laptop"}
        assert (
            other.call({"type": "report", "round": 1, "reward_mean": 0.5, "used": [r["id"] for r in sampled]})["type"]
            == "ack"
        )

        # A third node trains on the same groups: they become "aha" groups on the swarm page.
        _, third_token = make_node_with_token(owner=make_user(username="erin", display_name="Erin"), name="box")
        third = WireNode(sockets, live_server.ws_url, third_token)
        third.hello()
        # Credit is earned: a report may name only groups the pool served to that node.
        served = {r["id"] for r in third.call({"type": "sample", "n": 4})["rollouts"]}
        assert {r["id"] for r in sampled} <= served
        third.call({"type": "report", "round": 1, "reward_mean": 0.4, "used": [r["id"] for r in sampled]})

        # The leaderboard shows both, and updates live when the node shares again.
        page.goto(base + "/leaderboard/?view=nodes")
        laptop_row = page.locator("#leaderboard tr", has_text="laptop")
        expect(laptop_row).to_contain_text("Carol")
        expect(laptop_row.locator('[data-figure="accepted"]')).to_have_text("2")
        expect(laptop_row.locator('[data-figure="helped"]')).to_have_text("4", timeout=20_000)
        page.evaluate("window.__noReload = true")
        node.share([node.group()])
        expect(laptop_row.locator('[data-figure="accepted"]')).to_have_text("3", timeout=25_000)
        assert page.evaluate("window.__noReload") is True
        screenshot(page, "leaderboard-nodes")
        page.get_by_role("link", name="Contributors").click()
        expect(page.locator("#leaderboard tr", has_text="Carol")).to_be_visible()
        screenshot(page, "leaderboard-contributors")

        # Swarm status with its charts drawn from the JSON API (of credited groups: audited work).
        mark_audited(Node.objects.get(name="laptop"))
        page.goto(base + "/swarm/")
        expect(page.locator("#reward-chart svg")).to_be_visible()
        expect(page.locator("#accuracy-chart svg")).to_be_visible()
        expect(page.locator("#swarm-figures table")).to_contain_text("laptop")  # the aha groups
        screenshot(page, "swarm")

        # /me/: the rejection inbox, then revoke the token through htmx: the node is disconnected.
        page.goto(base + "/me/")
        expect(page.locator("#inbox + p + .table-wrap")).to_contain_text("reward_mismatch")
        expect(page.locator(".node-card .chart svg")).to_be_visible()
        expect(_cell(page, "laptop", "helped")).to_have_text("4")
        screenshot(page, "me")
        card = page.locator(".node-card", has_text="laptop")
        card.get_by_text("Rename, rotate, revoke or retire").click()
        card.get_by_role("button", name="Revoke token").click()
        expect(page.locator(".node-card", has_text="laptop")).to_contain_text("Revoked 1 token")
        with pytest.raises(ConnectionClosed) as closed:
            node.ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401

    # Phone-sized screens.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(base + "/me/")
    expect(page.locator(".node-card .chart[data-drawn]")).to_have_count(1)
    screenshot(page, "me-phone")
    page.goto(base + "/leaderboard/?view=nodes")
    screenshot(page, "leaderboard-phone")
    page.goto(base + "/")
    screenshot(page, "home-phone")


def test_error_page_is_in_the_site_style(live_server, page, screenshot):
    response = page.goto(live_server.url + "/no/such/page/")
    assert response.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    screenshot(page, "404")
