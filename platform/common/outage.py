"""One log line when a dependency (Redis, the database) starts failing and one when it answers again,
not a traceback per frame, page or heartbeat that meets the outage.

A 60 s Redis outage under 16 nodes logged 1,041 tracebacks: every frame, heartbeat and closes-listener
retry wrote its own. Code that meets a dependency's failure and carries on (degrades, retries later)
calls `failed(exc)`; code that used it successfully calls `answered()` (a no-op while it is up, so a
hot path may call it for every frame). Per process: each process logs its own view of the outage.

A hot path asks `skip()` first: while the dependency is down, one use per PROBE_SECONDS tries it and
the others take their degraded path at once. A Redis that hangs costs each use that tries it the
client's timeout (common.redis_client); without `skip()` every frame and page of the outage would wait
that once per Redis call it makes (docs/deploy.md, "When Redis fails").
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

#: While a dependency is down, how often a hot path tries it again (`Outage.skip`).
PROBE_SECONDS = 1.0


class Outage:
    """The state of one dependency as this process sees it: up, or down since a moment."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.since: float | None = None  # time.monotonic() of the first failure of the current outage
        self.failures = 0
        self.probed = 0.0  # time.monotonic() of the last use that skip() let through while down
        self.pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException) -> None:
        """A use of the dependency failed: the first failure of an outage is logged, the rest counted."""
        with self._lock:
            if self.pid != os.getpid():  # a forked process: its own outage, not its parent's
                self.pid, self.since = os.getpid(), None
            first = self.since is None
            if first:
                self.since = self.probed = time.monotonic()
                self.failures = 0
            self.failures += 1
        if first:
            logger.warning(
                "%s is unavailable (%s: %s); degrading until it answers again (failures meanwhile are not logged)",
                self.name,
                type(exc).__name__,
                str(exc).strip()[:300],
            )

    def skip(self) -> bool:
        """True while the dependency is down and was tried less than PROBE_SECONDS ago: the caller takes
        its degraded path without trying it. False otherwise: the caller tries it (while it is down, as
        the one probe of the next PROBE_SECONDS) and reports `failed()` or `answered()`."""
        if self.since is None:
            return False
        now = time.monotonic()
        with self._lock:
            if self.since is None or self.pid != os.getpid():  # up again, or a forked process's own view
                return False
            if now - self.probed < PROBE_SECONDS:
                return True
            self.probed = now
            return False

    def answered(self) -> None:
        """A use of the dependency succeeded: the end of an outage is logged."""
        if self.since is None:
            return
        with self._lock:
            since, self.since = self.since, None
            failures = self.failures
        if since is not None:
            logger.warning(
                "%s answers again after %.1f s unavailable (%d failures meanwhile)",
                self.name,
                time.monotonic() - since,
                failures,
            )


REDIS = Outage("Redis")
DATABASE = Outage("The database")


def forget_outages() -> None:
    """Every dependency up again, nothing logged (tests: each starts with no outage under way)."""
    for dependency in (REDIS, DATABASE):
        dependency.since = None


def dependency_failed(exc: BaseException) -> bool:
    """Record `exc` against the dependency that raised it; False when it is no dependency's failure
    (a bug: the caller logs its trace). Only what a dependency that is down or unreachable raises
    counts: a constraint violation or a bad statement is a bug, whatever library raised it."""
    import django.db
    import psycopg
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import ReadOnlyError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, (RedisConnectionError, RedisTimeoutError, ReadOnlyError)):
        REDIS.failed(exc)
    elif isinstance(
        exc, (django.db.OperationalError, django.db.InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
    ):
        DATABASE.failed(exc)
    elif isinstance(exc, OSError):  # a refused or reset connection to either
        REDIS.failed(exc)
    else:
        return False
    return True
