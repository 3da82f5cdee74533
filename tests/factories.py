"""Model factories for tests: plain functions with sensible defaults, every field overridable.

They go through the services, so a factory-made object is one the product could have made.
"""

from __future__ import annotations

import itertools
import uuid

from django.utils import timezone

from accounts.models import User
from accounts.services import user_create
from common.errors import ApplicationError
from nodes.models import Node, NodeToken
from nodes.services import node_create, node_token_issue
from pool.models import Rollout, Verdict
from sapo_node.tasks import CATALOGUES
from swarms.catalogue import entries_of_catalogue
from swarms.models import Swarm
from swarms.services import swarm_create, swarm_default_ensure

DEFAULT_PASSWORD = "a-long-test-passphrase-42"
_sequence = itertools.count(1)


def make_user(
    *, username: str | None = None, display_name: str | None = None, password: str | None = DEFAULT_PASSWORD, **fields
) -> User:
    """A contributor. Extra `fields` (banned_at=, is_staff=, ...) are saved after creation."""
    n = next(_sequence)
    username = username or f"user{n}"
    user = user_create(username=username, display_name=display_name or f"User {username}", password=password)
    if fields:
        for key, value in fields.items():
            setattr(user, key, value)
        user.save(update_fields=list(fields))
    return user


def make_node(*, owner: User | None = None, name: str | None = None, **fields) -> Node:
    """A node (of a new contributor unless `owner` is given). Extra `fields` are saved after creation."""
    owner = owner or make_user()
    node = node_create(owner=owner, name=name or f"node-{next(_sequence)}")
    if fields:
        for key, value in fields.items():
            setattr(node, key, value)
        node.save(update_fields=list(fields))
    return node


def make_node_token(*, node: Node | None = None) -> tuple[NodeToken, str]:
    """A token for `node` (a new node unless given): (the row, its plaintext)."""
    return node_token_issue(node=node or make_node())


def make_node_with_token(*, owner: User | None = None, name: str | None = None) -> tuple[Node, str]:
    node = make_node(owner=owner, name=name)
    _, plaintext = node_token_issue(node=node)
    return node, plaintext


def socket_node(token: str | None, connection_id: uuid.UUID | None = None) -> Node:
    """What a node socket opening with `token` gets on the connect path (nodes.sessions.nodes_sessions_open,
    as sockets.opening calls it; its session and presence record are written): its node, or its refusal
    raised (ApplicationError "unauthenticated" or "banned")."""
    from nodes.sessions import nodes_sessions_open

    answer = nodes_sessions_open(requests=[(token, connection_id or uuid.uuid4())])[0]
    if isinstance(answer, ApplicationError):
        raise answer
    return answer


def make_swarm(*, slug: str | None = None, catalogue: str = "easy", actor: User | None = None, **fields) -> Swarm:
    """An open swarm whose first catalogue version is the named catalogue's tasks (sapo_node.tasks.CATALOGUES)."""
    n = next(_sequence)
    actor = actor or make_user(is_staff=True)
    entries = entries_of_catalogue(CATALOGUES[catalogue])
    return swarm_create(
        actor=actor, slug=slug or f"swarm-{n}", title=fields.pop("title", f"Swarm {n}"), entries=entries, **fields
    )


def make_credited_group(node: Node, rewards: tuple[float, ...] = (1.0, 0.0), created_at=None, **fields) -> Rollout:
    """An accepted, audited group of `node` in the default swarm, stored as the pool stores one (no
    re-verification: for tests of the figures, which list a node and credit it for such groups).
    Unlike the other factories it writes the row itself: the pool's own path verifies a real share.
    `fields` set other columns (swarm, dataset, sampleable, moderation_status, ...)."""
    row = {
        "id": uuid.uuid4(),
        "node": node,
        "swarm": swarm_default_ensure(),
        "catalogue_version": 1,
        "round": 1,
        "dataset": "basic_arithmetic",
        "seed": 1,
        "index": Rollout.objects.count(),
        "completion_count": len(rewards),
        "claimed_rewards": list(rewards),
        "verified_rewards": list(rewards),
        "verdict": Verdict.ACCEPTED,
        "has_variance": len(set(rewards)) > 1,
        "sampleable": len(set(rewards)) > 1,
        "sample_seq": Rollout.objects.count() + 1,
        "created_at": created_at or timezone.now(),
        "audit_state": "audited",
    }
    return Rollout.objects.create(**{**row, **fields})
