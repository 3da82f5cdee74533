import psycopg
import pytest
from django.core.cache import cache
from django.db.backends import utils as db_utils

from sockets import ratelimit


@pytest.fixture
def no_cached_figures():
    """Cached figures (they live a few seconds) forgotten before and after the test: each test reads the
    figures of its own rows, none a test before it had cached (test_web_data.fresh_figures)."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def fresh_rate_counts():
    """In-process rate-limit counts start empty (tests reuse node ids across the run)."""
    ratelimit.reset_local()
    yield
    ratelimit.reset_local()


@pytest.fixture
def redis_url(settings) -> str:
    """A Redis to test against: REDIS_URL, or the local one; the test is skipped when none answers."""
    import redis

    url = settings.REDIS_URL or "redis://127.0.0.1:6379/0"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {url}")
    return url


@pytest.fixture(params=["redis", "no-redis"])
def backend(request, settings) -> str:
    """Run the test once with the counters in Redis and once without (PostgreSQL, or in-process)."""
    if request.param == "redis":
        settings.REDIS_URL = request.getfixturevalue("redis_url")
    else:
        settings.REDIS_URL = ""
    return request.param


@pytest.fixture
def statements(monkeypatch) -> list[str]:
    """Every SQL statement the process sends, from any thread (the sockets' calls run on common.db's)."""
    sent: list[str] = []
    execute, executemany = db_utils.CursorWrapper.execute, db_utils.CursorWrapper.executemany

    def counted_execute(self, sql, params=None):
        sent.append(str(sql))
        return execute(self, sql, params)

    def counted_executemany(self, sql, param_list):
        sent.append(str(sql))
        return executemany(self, sql, param_list)

    monkeypatch.setattr(db_utils.CursorWrapper, "execute", counted_execute)
    monkeypatch.setattr(db_utils.CursorWrapper, "executemany", counted_executemany)
    # and the statements sent on common.db.server_binding_cursor's psycopg cursors (Django's own
    # cursor is a psycopg.ClientCursor: counted above, not again)
    psycopg_execute = psycopg.Cursor.execute

    def counted_psycopg_execute(self, query, params=None, **kwargs):
        if type(self) is psycopg.Cursor:
            sent.append(str(query))
        return psycopg_execute(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted_psycopg_execute)
    return sent
