"""psycopg_pool: the pool Django makes checks each connection before handing it out.

Django gives psycopg's pool a `check` of its own only with CONN_HEALTH_CHECKS, which also costs a
round trip per call of a kept connection. The check wanted here (common.pg_lost.pool_check: a poll()
of the socket, no round trip) is set on the pool Django made, as the attribute the pool's constructor
stores its `check` argument in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.library_patches._inspect import names_used


def check_each_connection(pool: Any, check: Callable[[Any], None]) -> None:
    """Make `pool` (a psycopg_pool.ConnectionPool) run `check` on each connection it hands out, as
    `ConnectionPool(check=check)` would, unless it has a check already."""
    if getattr(pool, "_check", None) is None:
        pool._check = check


def moved() -> list[str]:
    """What `check_each_connection` relies on that this psycopg_pool no longer has where it expects."""
    from psycopg_pool import ConnectionPool

    def check(connection: Any) -> None:
        pass

    if ConnectionPool("", open=False, check=check).__dict__.get("_check") is not check:
        return ["psycopg_pool.ConnectionPool no longer keeps its check argument as _check"]
    methods = [m for name, m in vars(ConnectionPool).items() if callable(m) and name != "__init__"]
    if not any("_check" in names_used(m) for m in methods if hasattr(m, "__code__")):
        return ["psycopg_pool.ConnectionPool no longer runs _check on the connections it hands out"]
    return []
