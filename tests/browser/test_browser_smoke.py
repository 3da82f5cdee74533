"""The live server answers HTTP and WebSockets, and the browser fixtures work."""

from __future__ import annotations

import json

import pytest
from websockets.sync.client import connect

pytestmark = pytest.mark.browser


def test_live_server_serves_pages_and_node_socket(live_server, page, user, login, node_token):
    login(page, user)
    page.goto(live_server.url + "/accounts/password/")
    assert page.get_by_role("heading", name="Change password").is_visible()

    headers = {"Authorization": f"Bearer {node_token}"}
    with connect(live_server.ws_url + "/ws/node/", additional_headers=headers) as ws:
        ws.send(json.dumps({"type": "hello", "v": 1, "client": "test", "model": "tiny", "hardware": "cpu"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"


def test_run_async_helper(run_async):
    async def answer() -> int:
        return 42

    assert run_async(answer()) == 42


def test_in_thread_helper_allows_async_to_sync(page, in_thread):
    # Playwright keeps a running loop on this thread; async_to_sync works on the helper thread.
    from asgiref.sync import async_to_sync

    async def answer() -> int:
        return 7

    assert in_thread(async_to_sync(answer)) == 7
