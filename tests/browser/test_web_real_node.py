"""A real `sapo-node run` (the installed console script, tiny model) against the live server on
loopback: its groups show on /me/ and on the leaderboard."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from factories import make_node_with_token
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_real_node_run_shows_on_me_and_leaderboard(
    live_server, page, user, login, screenshot, tmp_path: Path, tiny_policy, tiny_cache_dir: Path
):
    # tiny_policy: the model is built (once per cache) before the node starts, not inside its time limit.
    _, token = make_node_with_token(owner=user, name="tiny-box")
    sapo_node = str(Path(sys.executable).parent / "sapo-node")  # the shared venv's console script
    run = subprocess.run(
        [
            sapo_node,
            "run",
            "--server",
            live_server.ws_url + "/ws/node/",
            "--rounds",
            "2",
            "--questions",
            "4",
            "--generations",
            "4",
            "--max-new-tokens",
            "32",
            "--out",
            str(tmp_path / "run"),
        ],
        env={**os.environ, "SAPO_TOKEN": token, "SAPO_CACHE": str(tiny_cache_dir)},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    login(page, user)
    page.goto(live_server.url + "/me/")
    row = page.locator('#node-table tr[data-node="tiny-box"]')
    expect(row).to_contain_text("tiny")  # the model it reported in hello
    accepted = int(row.locator('[data-figure="accepted"]').inner_text())
    rejected = int(row.locator('[data-figure="rejected"]').inner_text())
    assert accepted >= 1, (accepted, rejected, run.stderr[-2000:])
    screenshot(page, "me-real-node")

    page.goto(live_server.url + "/leaderboard/?view=nodes")
    expect(page.locator("#leaderboard tr", has_text="tiny-box").locator('[data-figure="accepted"]')).to_have_text(
        str(accepted)
    )
