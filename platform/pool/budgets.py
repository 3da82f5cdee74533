"""The hourly storage budgets of a node and of its contributor (docs/protocol.md, "Limits"):
`max_stored_bytes_per_node_hour` and `max_stored_bytes_per_contributor_hour`, counted in
NodeStorageHour. A share is checked against them before it is verified (pool.ingest) and charged by
its own INSERT (pool.ingest_statement); a round report is checked and charged here too
(pool.services.node_round_report)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone
from psycopg import sql

from common.composed import rendered
from common.errors import ApplicationError
from pool.limits import Limits
from sapo_node import protocol

#: What a stored row costs beyond its texts (ids, numbers, index entries), in the storage budgets.
ROW_OVERHEAD_BYTES = 200


@dataclass(frozen=True)
class StoredBytes:
    """A node's bytes stored in `hour`, and its contributor's (all their nodes), as a share's INSERT
    left them: what the node's next share on the same socket checks its budgets against
    (`storage_check`), without a query of its own."""

    hour: datetime
    node: int
    owner: int


def owner_hour_bytes_sql(owner: sql.Composable) -> sql.Composed:
    """The bytes a contributor's nodes stored in an hour (the contributor's storage budget), summed over
    its nodes' rows, `owner` being what names the contributor (a column or a parameter); the pool's
    INSERT leaves the storing node's row out (it adds that row's new total itself)."""
    return sql.SQL("""
SELECT coalesce(sum(o.bytes), 0) FROM pool_nodestoragehour o JOIN nodes_node n ON n.id = o.node_id
WHERE n.owner_id = {owner} AND o.hour = {hour}""").format(owner=owner, hour=sql.Placeholder("hour"))


def hour_of(now: datetime) -> datetime:
    """The budgets' hour that `now` falls in."""
    return now.replace(minute=0, second=0, microsecond=0)


def utf8_len(text: str | None) -> int:
    if text is None:
        return 0
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


_BUDGET_SQL = rendered(
    sql.SQL("""
SELECT coalesce((SELECT bytes FROM pool_nodestoragehour WHERE node_id = {node} AND hour = {hour}), 0),
       ({owner})
""").format(
        node=sql.Placeholder("node"), hour=sql.Placeholder("hour"), owner=owner_hour_bytes_sql(sql.Placeholder("owner"))
    )
)


def storage_check(*, node: Any, limits: Limits, now: datetime | None = None, known: StoredBytes | None = None) -> None:
    """Raise ApplicationError "over_budget" when the node, or its contributor's nodes together, have
    stored their hourly budget of bytes already. Checked before a share is verified (a node over its
    budget costs one small query per frame); the write that crosses the budget is still stored, so a
    budget is exceeded by at most one frame per open socket.

    `known`: the figures the socket's previous share left (ShareResult.stored), used instead of the
    query when they are of this hour. They can only be low (bytes are only added within an hour), and
    the share they let through brings fresh ones back with its own INSERT: the bound above holds."""
    now = now or timezone.now()
    hour = hour_of(now)
    if known is not None and known.hour == hour:
        node_bytes, owner_bytes = known.node, known.owner
    else:
        with connection.cursor() as cursor:
            cursor.execute(_BUDGET_SQL, {"node": node.id, "owner": node.owner_id, "hour": hour})
            node_bytes, owner_bytes = (int(v) for v in cursor.fetchone())
    until = f"until {hour + timedelta(hours=1):%H:%M} UTC"
    if node_bytes >= limits.max_stored_bytes_per_node_hour:
        raise ApplicationError(
            protocol.OVER_BUDGET,
            f"this node stored {node_bytes} bytes this hour, its budget is "
            f"{limits.max_stored_bytes_per_node_hour}: nothing more is stored {until}",
        )
    if owner_bytes >= limits.max_stored_bytes_per_contributor_hour:
        raise ApplicationError(
            protocol.OVER_BUDGET,
            f"this contributor's nodes stored {owner_bytes} bytes this hour, the budget is "
            f"{limits.max_stored_bytes_per_contributor_hour}: nothing more is stored {until}",
        )


def storage_charge(node_id: int, size: int, now: datetime) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pool_nodestoragehour AS s (node_id, hour, bytes) VALUES (%(node)s, %(hour)s, %(bytes)s)
            ON CONFLICT (node_id, hour) DO UPDATE SET bytes = s.bytes + EXCLUDED.bytes
            """,
            {"node": node_id, "hour": hour_of(now), "bytes": size},
        )
