"""nodes.sessions.nodes_sessions_open: a node socket's session opened in one statement (token, standing,
last used, last seen, presence), with presence in the database or in Redis."""

from __future__ import annotations

import os
import uuid

import pytest
from django.utils import timezone
from factories import make_node_with_token, socket_node

from accounts.models import User
from common.errors import ApplicationError
from nodes import presence
from nodes.models import Node, NodeToken
from nodes.services import node_retire, node_token_revoke
from nodes.sessions import nodes_sessions_open

pytestmark = pytest.mark.django_db


def banned_node_with_token():
    node, token = make_node_with_token()
    User.objects.filter(id=node.owner_id).update(banned_at=timezone.now())
    return node, token


STORES = ["database"] + (["redis"] if os.environ.get("REDIS_URL") else [])


@pytest.fixture(params=STORES)
def store(request, settings):
    settings.REDIS_URL = os.environ["REDIS_URL"] if request.param == "redis" else ""
    settings.SAPO_REDIS_PREFIX = f"sessions-test-{uuid.uuid4().hex[:8]}"
    settings.SAPO_SERVER_NAME = "here"
    return request.param


def refused(token: str | None) -> str:
    with pytest.raises(ApplicationError) as info:
        socket_node(token)
    return info.value.code


def test_a_session_records_last_used_last_seen_and_presence(store, node, node_token):
    opened = socket_node(node_token)

    assert opened == node and opened.name == "laptop" and opened.owner_id == node.owner_id
    node.refresh_from_db()
    assert node.last_seen_at is not None and opened.last_seen_at == node.last_seen_at
    assert NodeToken.objects.get(node=node).last_used_at == node.last_seen_at
    assert presence.connection_counts([node.id]) == {node.id: 1}
    socket_node(node_token)
    assert presence.connection_counts([node.id]) == {node.id: 2}


def test_a_node_returned_can_be_saved(store, node, node_token):
    opened = socket_node(node_token)
    opened.hardware = "a GPU"
    opened.save(update_fields=["hardware"])
    node.refresh_from_db()
    assert node.hardware == "a GPU" and node.name == "laptop"


@pytest.mark.parametrize("token", [None, "", "sapo_", "not-a-sapo-token", "sapo_unknown", "sapo_" + "x" * 500])
def test_a_missing_malformed_or_unknown_token_is_unauthenticated(store, token):
    assert refused(token) == "unauthenticated"


def test_refusals_write_nothing(store, user, node, node_token):
    Node.objects.filter(id=node.id).update(banned_at=timezone.now())
    assert refused(node_token) == "banned"
    Node.objects.filter(id=node.id).update(banned_at=None)
    User.objects.filter(id=user.id).update(banned_at=timezone.now())
    assert refused(node_token) == "banned"
    User.objects.filter(id=user.id).update(banned_at=None)
    node_token_revoke(node=node)
    assert refused(node_token) == "unauthenticated"

    node.refresh_from_db()
    assert node.last_seen_at is None
    assert NodeToken.objects.get(node=node).last_used_at is None
    assert presence.connection_counts([node.id]) == {}


def test_a_retired_node_is_unauthenticated(store, node, node_token):
    node_retire(node=node)
    assert refused(node_token) == "unauthenticated"


def test_sessions_opened_together_each_get_their_own_answer_and_only_the_good_ones_write(store, user, node, node_token):
    banned_node, banned_token = banned_node_with_token()
    revoked_node, revoked_token = make_node_with_token()
    node_token_revoke(node=revoked_node)
    retired_node, retired_token = make_node_with_token()
    node_retire(node=retired_node)
    other, other_token = make_node_with_token()
    tokens = [
        node_token,
        banned_token,
        "not-a-token",
        revoked_token,
        node_token,
        "sapo_unknown",
        retired_token,
        other_token,
    ]
    connections = [uuid.uuid4() for _ in tokens]

    answers = nodes_sessions_open(requests=list(zip(tokens, connections, strict=True)))

    codes = [a.code if isinstance(a, ApplicationError) else a.id for a in answers]
    assert codes == [
        node.id,
        "banned",
        "unauthenticated",
        "unauthenticated",
        node.id,
        "unauthenticated",
        "unauthenticated",
        other.id,
    ]
    assert presence.connection_counts() == {node.id: 2, other.id: 1}  # the same token twice: two sockets
    for quiet in (banned_node, revoked_node, retired_node):
        quiet.refresh_from_db()
        assert quiet.last_seen_at is None and NodeToken.objects.get(node=quiet).last_used_at is None
    for seen in (node, other):
        seen.refresh_from_db()
        assert seen.last_seen_at == answers[tokens.index(other_token if seen == other else node_token)].last_seen_at
    assert nodes_sessions_open(requests=[]) == []
