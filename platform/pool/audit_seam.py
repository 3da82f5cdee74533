"""What the pool asks of an audits layer, and the one it uses now.

The pool is below the audits (docs/architecture.md): it never imports them. Before a batch's statement
it asks which of its nodes are held after a failed audit (`nodes_held`: their groups go in unaudited
and out of sampling, so no sample ever sees them); after it, it tells them which groups it stored
(`groups_stored`: they choose which weights to audit, and answer what each node is asked to upload, for
its ack), and when a node says hello it asks what that node must still upload (`node_audits`, for its
welcome). The audits app registers its implementation in its
AppConfig.ready(); without it the pool asks for nothing.

An audit as the wire carries it is sapo_node.protocol.WireAudit's fields, as a dict.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol


class PoolAudits(Protocol):
    def nodes_held(self, *, node_ids: set[int]) -> set[int]:
        """Those of `node_ids` held for staff review after a failed audit."""
        ...

    def groups_stored(self, *, inserted: set[uuid.UUID]) -> dict[int, list[dict[str, Any]]]:
        """After the statement that inserted `inserted`: the audits newly asked of each node, by node id."""
        ...

    def node_audits(self, *, node_id: int) -> list[dict[str, Any]]:
        """The audits the node has yet to upload for."""
        ...


class NoAudits:
    """The default: audits nothing."""

    def nodes_held(self, *, node_ids: set[int]) -> set[int]:
        return set()

    def groups_stored(self, *, inserted: set[uuid.UUID]) -> dict[int, list[dict[str, Any]]]:
        return {}

    def node_audits(self, *, node_id: int) -> list[dict[str, Any]]:
        return []


NO_AUDITS: PoolAudits = NoAudits()
_current: PoolAudits = NO_AUDITS


def audits_register(implementation: PoolAudits) -> None:
    """Set the pool's audits (audits' AppConfig.ready(); NO_AUDITS to switch them off)."""
    global _current
    _current = implementation


def audits() -> PoolAudits:
    """The audits in force: the registered one, else NO_AUDITS."""
    return _current
