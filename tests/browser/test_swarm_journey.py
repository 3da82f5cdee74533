"""An operator opens a swarm on its staff page, a contributor's node joins it over the node WebSocket
(`hello` naming it) and shares a group, and the node shows on the swarm's page and in the list."""

from __future__ import annotations

import json

import pytest
from factories import make_node_with_token, make_user
from playwright.sync_api import expect
from support.pool import EASY, make_group, share_frame
from websockets.sync.client import connect

from sapo_node.tasks import CATALOGUES
from swarms.catalogue import entries_of_catalogue

pytestmark = pytest.mark.browser


def test_an_operator_opens_a_swarm_and_a_contributors_node_joins_it(live_server, page, login, screenshot):
    operator = make_user(is_staff=True)
    login(page, operator)
    page.goto(live_server.url + "/swarms/")
    page.get_by_role("link", name="Open a new swarm").click()
    page.fill('input[name="slug"]', "laptops")
    page.fill('input[name="title"]', "Laptop swarm")
    page.fill('textarea[name="description"]', "Easy tasks for small models on CPUs.")
    page.fill('input[name="recommended_models"]', "tiny-mini")
    page.fill("#entries", json.dumps(entries_of_catalogue(CATALOGUES["easy"])))
    page.fill('#swarm-form input[name="reason"]', "a campaign for laptops")
    page.get_by_role("button", name="Open the swarm").click()
    # Saving builds an entry of each dataset in a bounded worker (the first save of a server process
    # starts the fork server, which imports reasoning-gym): seconds on a loaded machine.
    expect(page).to_have_url(live_server.url + "/swarms/laptops/manage/", timeout=60_000)
    expect(page.locator("#swarm-state")).to_have_text("Open")
    screenshot(page, "swarm-manage")

    # A contributor's node names the swarm in its hello and shares a group of its catalogue.
    _, token = make_node_with_token(name="laptop-node")
    with connect(live_server.ws_url + "/ws/node/", additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send(json.dumps({"type": "hello", "v": 1, "client": "t", "model": "tiny-mini", "swarm": "laptops"}))
        welcome = json.loads(ws.recv(timeout=10))
        assert welcome["swarm"]["slug"] == "laptops" and welcome["swarm"]["recommended_models"] == ["tiny-mini"]
        group = make_group("basic_arithmetic", catalogue=EASY)
        ws.send(json.dumps(share_frame(group)))
        assert json.loads(ws.recv(timeout=10))["accepted"] == [group["id"]]

        page.goto(live_server.url + "/swarms/laptops/")
        expect(page.locator("h1")).to_contain_text("Laptop swarm")
        expect(page.locator("#nodes-online")).to_have_text("1", timeout=15_000)
        screenshot(page, "swarm-page")
        page.goto(live_server.url + "/swarms/")
        expect(page.locator("#swarm-laptops")).to_contain_text("Open")
        expect(page.locator("#swarm-laptops td[data-label='Nodes online']")).to_have_text("1")
