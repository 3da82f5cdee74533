"""Step 4 of a round: offer the round's own groups to the swarm.

The transport makes this durable (the WebSocket transport writes the outbox before returning) and
sends in the background, so sharing never waits on the network.
"""

from __future__ import annotations

from sapo_node.groups import Group
from sapo_node.transport.base import Transport


def share_groups(transport: Transport, groups: list[Group]) -> int:
    """Share every own group (S = B: the pool serves only groups whose rewards differ anyway)."""
    transport.share(groups)
    return len(groups)
