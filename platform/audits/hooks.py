"""The audits' side of the pool's seam (pool.audit_seam), registered in AuditsConfig.ready()."""

from __future__ import annotations

import uuid
from typing import Any

from audits import selection
from audits.selectors import node_requested_audits


class PoolAuditsImpl:
    def nodes_held(self, *, node_ids: set[int]) -> set[int]:
        return selection.held_node_ids(node_ids)

    def groups_stored(self, *, inserted: set[uuid.UUID]) -> dict[int, list[dict[str, Any]]]:
        return selection.groups_stored(inserted=inserted)

    def node_audits(self, *, node_id: int) -> list[dict[str, Any]]:
        return [selection.audit_wire(a) for a in node_requested_audits(node_id=node_id)]


AUDITS = PoolAuditsImpl()
