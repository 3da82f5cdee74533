"""A node paused and resumed from the site, and what its client says it is doing (nodes.services.node_pause_set,
the `pause` and `status` frames through the ASGI application, nodes.selectors.node_activity, /me/)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.core.cache import cache
from django.utils import timezone
from factories import make_node
from node_sockets import ask, open_socket

from common.errors import ApplicationError
from figures.swarm import swarm_overview
from nodes import presence
from nodes.models import Node, NodeStatus
from nodes.selectors import PAUSE_ANSWER_WINDOW, node_activity
from nodes.services import node_pause_set, node_retire
from pool.limits import current_limits
from sapo_node import __version__, protocol
from sockets.messages import ProtocolError, Status, parse_frame
from swarms.scope import SITE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fresh_rate_counts")]

HELLO = {"type": "hello", "v": 1, "client": "sapo-node/test", "model": "tiny", "hardware": "cpu"}


async def next_frame(socket, kind: str) -> dict:
    """The next frame of type `kind` the server sends (acks of other frames are passed over)."""
    while True:
        frame = await socket.receive_json_from(timeout=5)
        if frame["type"] == kind:
            return frame


async def test_the_welcome_says_paused_and_the_latest_client_and_a_pause_reaches_the_open_socket(node, node_token):
    socket = await open_socket(node_token)
    welcome = await ask(socket, HELLO)
    assert (welcome["paused"], welcome["latest_client"]) == (False, __version__)

    await sync_to_async(node_pause_set)(node=node, paused=True)  # the owner's button: an order on commit
    frame = await next_frame(socket, protocol.PAUSE)
    assert frame["paused"] is True and "paused from the site" in frame["detail"]
    again = await ask(socket, HELLO)  # a hello again on the socket says the same
    assert again["paused"] is True

    await sync_to_async(node_pause_set)(node=node, paused=False)
    assert (await next_frame(socket, protocol.PAUSE))["paused"] is False
    await socket.disconnect()


async def test_a_node_connecting_while_paused_learns_it_from_its_welcome(node, node_token):
    await sync_to_async(node_pause_set)(node=node, paused=True)
    socket = await open_socket(node_token)
    assert (await ask(socket, HELLO))["paused"] is True
    await socket.disconnect()


async def test_a_status_is_acknowledged_and_written_with_the_next_beat(node, node_token):
    socket = await open_socket(node_token, hello=True)
    await sync_to_async(node_pause_set)(node=node, paused=True)
    await next_frame(socket, protocol.PAUSE)
    status = {
        "type": "status",
        "v": 1,
        "state": "training",
        "paused_for": ["site"],
        "round_seconds": 2.5,
        "tokens_per_second": 812.5,
    }
    assert await ask(socket, status) == {"type": "ack", "v": 1, "for": "status"}
    await presence.socket_book().beat(renew=False)
    row = await sync_to_async(Node.objects.get)(id=node.id)
    assert (row.reported_state, row.reported_paused, row.round_seconds, row.tokens_per_second) == (
        "training",
        True,
        2.5,
        812.5,
    )
    assert row.reported_at >= row.paused_at
    # A status without figures keeps the last ones.
    await ask(socket, {"type": "status", "v": 1, "state": "paused", "paused_for": ["site"]})
    await presence.socket_book().beat(renew=False)
    row = await sync_to_async(Node.objects.get)(id=node.id)
    assert (row.reported_state, row.round_seconds, row.tokens_per_second) == ("paused", 2.5, 812.5)
    await socket.disconnect()


async def test_a_bad_status_is_refused_and_nothing_is_written(node, node_token):
    socket = await open_socket(node_token, hello=True)
    reply = await ask(socket, {"type": "status", "v": 1, "state": "mining", "ref": "7"})
    assert (reply["type"], reply["code"], reply["ref"]) == ("error", protocol.INVALID_MESSAGE, "7")
    await presence.socket_book().beat(renew=False)
    assert (await sync_to_async(Node.objects.get)(id=node.id)).reported_state == ""
    await socket.disconnect()


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({}, "state"),
        ({"state": "training", "paused_for": "site"}, "paused_for"),
        ({"state": "training", "paused_for": ["x"] * 9}, "paused_for"),
        ({"state": "training", "paused_for": [""]}, "paused_for[0]"),
        ({"state": "training", "paused_for": ["s" * 33]}, "paused_for[0]"),
        ({"state": "training", "paused_for": ["a\x00b"]}, "paused_for[0]"),
        ({"state": "training", "round_seconds": -1}, "round_seconds"),
        ({"state": "training", "round_seconds": 7 * 86_400 + 1}, "round_seconds"),
        ({"state": "training", "tokens_per_second": "fast"}, "tokens_per_second"),
        ({"state": "training", "tokens_per_second": 1e8}, "tokens_per_second"),
    ],
)
def test_status_frames_are_bounded(fields, path):
    with pytest.raises(ProtocolError) as caught:
        parse_frame(json.dumps({"type": "status", "v": 1, **fields}), current_limits())
    assert caught.value.code == protocol.INVALID_MESSAGE
    assert caught.value.detail.startswith(f"{path}:")


def test_a_status_parses_into_its_fields():
    frame = (
        '{"type": "status", "v": 1, "state": "paused", "paused_for": ["site", "site", "battery"], "round_seconds": 3}'
    )
    assert parse_frame(frame, current_limits()) == Status(
        ref=None, state="paused", paused_for=("site", "battery"), round_seconds=3.0, tokens_per_second=None
    )


def test_pausing_is_idempotent_and_a_retired_node_cannot_be_paused(node):
    paused = node_pause_set(node=node, paused=True)
    first = paused.paused_at
    assert first is not None
    assert node_pause_set(node=node, paused=True).paused_at == first  # no second order, same time
    assert node_pause_set(node=node, paused=False).paused_at is None
    node_retire(node=node)
    with pytest.raises(ApplicationError) as caught:
        node_pause_set(node=node, paused=True)
    assert caught.value.code == "node_retired"


def test_the_site_says_where_a_pause_stands(node):
    now = timezone.now()
    node.paused_at = now
    online = NodeStatus.ONLINE
    assert node_activity(node, status=NodeStatus.OFFLINE, now=now).pause == "offline"
    assert node_activity(node, status=online, now=now + timedelta(seconds=5)).pause == "requested"
    # A client that never answers (older than pausing) is named once the window has passed.
    assert node_activity(node, status=online, now=now + PAUSE_ANSWER_WINDOW).pause == "too_old"
    # An answer from before this pause (the last one's) does not count.
    node.reported_paused, node.reported_at, node.reported_state = True, now - timedelta(seconds=1), "paused"
    assert node_activity(node, status=online, now=now + PAUSE_ANSWER_WINDOW).pause == "too_old"
    node.reported_at = now + timedelta(seconds=1)
    activity = node_activity(node, status=online, now=now + PAUSE_ANSWER_WINDOW)
    assert (activity.pause, activity.state) == ("paused", "paused")
    # The state is shown while the node is connected and said it lately.
    assert node_activity(node, status=NodeStatus.OFFLINE, now=now).state == ""
    assert node_activity(node, status=online, now=now + timedelta(minutes=3)).state == ""
    node.paused_at = None
    assert node_activity(node, status=online, now=now + timedelta(seconds=2)).pause == ""


def test_the_owner_pauses_and_resumes_from_me_and_no_one_else_can(client, user, node, other_user):
    client.force_login(other_user)
    assert client.post(f"/me/nodes/{node.id}/pause/").status_code == 404
    node.refresh_from_db()
    assert node.paused_at is None

    client.force_login(user)
    assert client.get(f"/me/nodes/{node.id}/pause/").status_code == 405
    response = client.post(f"/me/nodes/{node.id}/pause/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Paused: the node is offline, and stays paused when it connects." in body
    assert f'action="/me/nodes/{node.id}/resume/"' in body and ">Resume</button>" in body
    node.refresh_from_db()
    assert node.paused_at is not None

    response = client.post(f"/me/nodes/{node.id}/resume/")
    assert response.status_code == 302
    node.refresh_from_db()
    assert node.paused_at is None
    assert ">Pause</button>" in client.get("/me/").content.decode()


def test_pause_needs_csrf(user, node):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(f"/me/nodes/{node.id}/pause/").status_code == 403


def test_a_node_quiet_for_long_with_its_socket_open_counts_among_nodes_online(user):
    """A node in a long round sends no frame for minutes: with its socket open it is one of the nodes
    online all the same."""
    quiet = make_node(owner=user, name="long-rounds")
    Node.objects.filter(id=quiet.id).update(last_seen_at=timezone.now() - timedelta(minutes=30))
    presence.connections_renew(connections={uuid.uuid4(): quiet.id})
    cache.clear()
    assert swarm_overview(scope=SITE)["nodes_online"] == 1


def test_me_shows_what_the_client_says(client, user, node):
    Node.objects.filter(id=node.id).update(
        reported_state="training", reported_at=timezone.now(), round_seconds=12.5, tokens_per_second=812.4
    )
    presence.connections_renew(connections={uuid.uuid4(): node.id})
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now())
    client.force_login(user)
    body = client.get("/me/").content.decode()
    assert "<dd data-state>training</dd>" in body
    assert "812 tokens/s" in body and "12.5 s" in body
    public = client.get(f"/nodes/{node.id}/").content.decode()
    assert "<dd data-state>training</dd>" in public and "812 tokens/s" in public
