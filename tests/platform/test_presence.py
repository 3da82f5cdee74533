"""nodes.presence: one record per open socket, renewed by a heartbeat, expiring, forgotten by its own
server's restart; in the database without REDIS_URL, in Redis with it (both stores, same tests)."""

from __future__ import annotations

import os
import uuid
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from factories import make_node

from figures.swarm import swarm_overview
from nodes import presence
from nodes.models import Node, NodeConnection, NodeStatus
from nodes.selectors import node_status
from swarms.scope import SITE, Scope

pytestmark = pytest.mark.django_db

STORES = ["database"] + (["redis"] if os.environ.get("REDIS_URL") else [])


@pytest.fixture(params=STORES)
def store(request, settings):
    settings.REDIS_URL = os.environ["REDIS_URL"] if request.param == "redis" else ""
    settings.SAPO_REDIS_PREFIX = f"presence-test-{uuid.uuid4().hex[:8]}"  # nothing left from other tests
    settings.SAPO_SERVER_NAME = "here"
    return request.param


def test_each_socket_counts_until_it_closes(store, node):
    other = make_node(name="desktop")
    first, second = uuid.uuid4(), uuid.uuid4()
    assert presence.connected_node_ids() == set()
    presence.connections_renew(connections={first: node.id})
    presence.connections_renew(connections={second: node.id})
    presence.connections_renew(connections={uuid.uuid4(): other.id})
    assert presence.connection_counts() == {node.id: 2, other.id: 1}
    assert presence.connection_counts([node.id]) == {node.id: 2}
    presence.connection_close(node_id=node.id, connection_id=first)
    presence.connection_close(node_id=node.id, connection_id=first)  # twice: harmless
    assert presence.connection_counts([node.id]) == {node.id: 1}
    presence.connection_close(node_id=node.id, connection_id=second)
    assert presence.connected_node_ids([node.id, other.id]) == {other.id}
    if store == "database":
        assert NodeConnection.objects.filter(node=node).count() == 0


def test_a_record_nobody_renews_expires_and_the_heartbeat_keeps_it(store, node):
    start = timezone.now()
    lasting, dropped = uuid.uuid4(), uuid.uuid4()
    for connection_id in (lasting, dropped):
        presence.connections_renew(connections={connection_id: node.id}, now=start)
    beat = start + timedelta(seconds=presence.heartbeat_seconds())
    presence.connections_renew(connections={lasting: node.id}, now=beat)  # only one socket beats
    after = start + timedelta(seconds=presence.expires_after_seconds() + 1)
    assert presence.connection_counts([node.id], now=after) == {node.id: 1}
    later = beat + timedelta(seconds=presence.expires_after_seconds() + 1)
    assert presence.connected_node_ids(now=later) == set()


def test_a_restarted_server_forgets_its_own_sockets_not_other_servers(store, node, settings):
    other = make_node(name="desktop")
    presence.connections_renew(connections={uuid.uuid4(): node.id}, swarms={})
    mine_in_a_swarm = uuid.uuid4()
    presence.connections_renew(connections={mine_in_a_swarm: node.id}, swarms={mine_in_a_swarm: 7})
    settings.SAPO_SERVER_NAME = "elsewhere"
    theirs = uuid.uuid4()
    presence.connections_renew(connections={theirs: other.id}, swarms={theirs: 7})
    settings.SAPO_SERVER_NAME = "here"
    assert presence.presence_server_start() == 2
    assert presence.connected_node_ids() == {other.id}
    assert presence.connected_node_ids(scope=Scope.swarm(7)) == {other.id}


def test_a_sockets_record_carries_the_swarm_it_is_in(store, node):
    """The swarm's nodes online read presence: each record says its socket's swarm once known, for the
    counts, the node filter and a close alike; a socket not placed yet counts in no swarm."""
    other, third = make_node(name="desktop"), make_node(name="gpu")
    easy, paper, unplaced = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    presence.connections_renew(
        connections={easy: node.id, paper: other.id, unplaced: third.id}, swarms={easy: 1, paper: 2}
    )
    assert presence.connected_node_ids() == {node.id, other.id, third.id}
    assert presence.connected_node_ids(scope=Scope.swarm(1)) == {node.id}
    assert presence.connection_counts(scope=Scope.swarm(2)) == {other.id: 1}
    assert presence.connected_node_ids(scope=Scope.swarm(3)) == set()
    in_paper = Node.objects.filter(presence.connected_filter(scope=Scope.swarm(2))).values_list("id", flat=True)
    assert list(in_paper) == [other.id]
    # The unplaced socket's hello named swarm 1: its next renewal moves it there.
    presence.connections_renew(connections={unplaced: third.id}, swarms={unplaced: 1})
    assert presence.connected_node_ids(scope=Scope.swarm(1)) == {node.id, third.id}
    presence.connection_close(node_id=other.id, connection_id=paper, swarm_id=2)
    assert presence.connected_node_ids(scope=Scope.swarm(2)) == set()
    assert presence.connected_node_ids() == {node.id, third.id}
    later = timezone.now() + timedelta(seconds=presence.expires_after_seconds() + 1)
    assert presence.connected_node_ids(scope=Scope.swarm(1), now=later) == set()


def test_status_reads_presence_and_last_seen(store, node):
    node.last_seen_at = timezone.now()
    node.save(update_fields=["last_seen_at"])
    assert node_status(node) == NodeStatus.OFFLINE  # seen just now, but no socket open
    connection_id = uuid.uuid4()
    presence.connections_renew(connections={connection_id: node.id})
    assert node_status(node) == NodeStatus.ONLINE
    now = timezone.now()
    assert node.status_at(now + timedelta(minutes=10), connected=True) == NodeStatus.IDLE
    assert node.status_at(now + timedelta(hours=2), connected=True) == NodeStatus.OFFLINE
    presence.connection_close(node_id=node.id, connection_id=connection_id)
    assert node_status(node) == NodeStatus.OFFLINE


def test_listings_show_who_is_connected_at_a_cost_that_does_not_grow_with_nodes(store, user, node, api_client):
    """A listing asks presence once for all its nodes (in the database: inside the nodes' own query),
    so the node list costs the same queries for 2 nodes as for 6, and each shows its own status; the
    swarm's online count agrees."""

    def connect(*nodes: Node) -> None:
        Node.objects.filter(id__in=[n.id for n in nodes]).update(last_seen_at=timezone.now())
        for n in nodes:
            presence.connections_renew(connections={uuid.uuid4(): n.id})

    def listed() -> tuple[dict[str, str], int]:
        with CaptureQueriesContext(connection) as queries:
            response = api_client.get("/api/v1/nodes/")
        assert response.status_code == 200
        return {n["name"]: n["status"] for n in response.json()}, len(queries)

    def online() -> int:
        cache.clear()  # the swarm's figures are cached a few seconds
        return swarm_overview(scope=SITE)["nodes_online"]

    connect(node)
    make_node(owner=user, name="desktop")
    statuses, few = listed()
    assert statuses == {"laptop": NodeStatus.ONLINE, "desktop": NodeStatus.OFFLINE}
    assert online() == 1

    connect(*(make_node(owner=user, name=f"gpu{i}") for i in range(2)))
    make_node(owner=user, name="idle box")
    connect(make_node(name="elsewhere"))  # another contributor's: not listed, but online
    statuses, many = listed()
    assert statuses == {
        "laptop": NodeStatus.ONLINE,
        "desktop": NodeStatus.OFFLINE,
        "gpu0": NodeStatus.ONLINE,
        "gpu1": NodeStatus.ONLINE,
        "idle box": NodeStatus.OFFLINE,
    }
    assert many == few
    assert online() == 4
