"""Per dataset and day figures of some nodes' recent groups (the public pages' table)."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from psycopg import sql

from figures import credit


def _datasets_sql() -> sql.Composed:
    """The newest `limit` groups of the nodes since `since` (the pool's (node, created_at) index), per
    dataset and day."""
    return sql.SQL(
        "SELECT r.dataset, date_trunc('day', r.created_at) AS day, {measures} "
        "FROM (SELECT * FROM pool_rollout WHERE node_id = ANY(%(nodes)s) AND created_at >= %(since)s "
        "ORDER BY created_at DESC LIMIT %(limit)s) r {lateral} GROUP BY 1, 2 ORDER BY 1, 2"
    ).format(measures=credit.measures(["accepted", "completions", "reward"]), lateral=credit.credit_lateral())


def datasets_by_day(*, node_ids: list[int], since: datetime, limit: int) -> list[tuple[str, datetime, int, int, float]]:
    """(dataset, day, accepted groups, credited completions, verified reward) of the nodes' newest
    `limit` groups since `since`, in order of dataset and day."""
    if not node_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_datasets_sql(), {"nodes": node_ids, "since": since, "limit": limit})
        return [(d, day, int(a), int(c), float(r)) for d, day, a, c, r in cursor.fetchall()]
