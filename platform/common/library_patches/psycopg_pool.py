"""psycopg_pool: the pool Django makes checks each connection before handing it out, and retries a
lost database at most every few seconds.

Django gives psycopg's pool a `check` of its own only with CONN_HEALTH_CHECKS, which also costs a
round trip per call of a kept connection. The check wanted here (common.pg_lost.pool_check: a poll()
of the socket, no round trip) is set on the pool Django made, as the attribute the pool's constructor
stores its `check` argument in.

While the database is down, the pool's attempts to reconnect wait 1, 2, 4, 8, ... seconds between
them (`AttemptWithBackoff`, no cap below its 300-second reconnect timeout): after an outage of 40
seconds, the next attempt came up to 30 seconds after the database was back, and every request
meanwhile waited out the pool's timeout. `cap_reconnect_backoff` bounds the wait between attempts.
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


def cap_reconnect_backoff(max_delay: float) -> None:
    """The pool's reconnection attempts wait at most `max_delay` seconds between them (a class attribute
    the patched `update_delay` reads, so setting it again changes the cap)."""
    from psycopg_pool.base import AttemptWithBackoff

    AttemptWithBackoff.SAPO_MAX_DELAY = max_delay
    if getattr(AttemptWithBackoff.update_delay, "_sapo_capped", False):
        return
    uncapped = AttemptWithBackoff.update_delay

    def update_delay(self: Any, now: float) -> None:
        uncapped(self, now)
        self.delay = min(self.delay, self.SAPO_MAX_DELAY)

    update_delay._sapo_capped = True
    AttemptWithBackoff.update_delay = update_delay


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
    from psycopg_pool import pool as pool_module
    from psycopg_pool.base import AttemptWithBackoff

    if getattr(pool_module, "AttemptWithBackoff", None) is not AttemptWithBackoff:
        return ["psycopg_pool.pool no longer retries a connection with base.AttemptWithBackoff"]
    if "delay" not in names_used(ConnectionPool._add_connection) or "delay" not in vars(
        AttemptWithBackoff(timeout=1.0)
    ):
        return ["psycopg_pool's AttemptWithBackoff no longer keeps the wait before the next attempt as `delay`"]
    return []
