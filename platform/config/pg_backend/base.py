"""Django's PostgreSQL backend, with its connection pool checking each connection it hands out.

A PostgreSQL restart ends every session; the connections idle in the pool do not know it until they
next send a statement, so each would fail the request or call it served next, long after the
database was back. The pool throws away one whose server has hung up before handing it out
(common.pg_lost: a poll() of its socket, no round trip). Django gives psycopg's pool a `check` of its
own only with CONN_HEALTH_CHECKS, which also costs a round trip per call of a kept connection, so
the check is set on the pool Django made (common.library_patches.psycopg_pool).

While the database is down, the pool retries at most every SAPO_DB_RECONNECT_SECONDS (psycopg_pool
doubles its wait without a cap below five minutes): the site serves again within about that long of
the database's return (docs/deploy.md#database-outages).
"""

from django.conf import settings
from django.db.backends.postgresql import base

from common.library_patches.psycopg_pool import cap_reconnect_backoff, check_each_connection
from common.pg_lost import pool_check


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool = super().pool
        if pool is not None:
            check_each_connection(pool, pool_check)
            cap_reconnect_backoff(settings.SAPO_DB_RECONNECT_SECONDS)
        return pool
