"""Project-wide fixtures. Tests run on real PostgreSQL: DATABASE_URL when set, otherwise the
embedded server (common/embedded_db.py), started on first use and left running.

Each pytest process gets its own test database (`test_<name>_p<pid>`), so several helpers' runs
can share one server at the same time.

The built-in tiny models (`tiny_policy`, `tiny_mini_policy`, session) are built once per cache
folder (about a minute on 2 cores) and reused by later runs: <repo>/var/test-cache, or
$SAPO_TEST_CACHE. Nothing reaches the network: the Hugging Face hub is switched offline.

Factories live in tests/factories.py (`from factories import make_user, make_node, ...`).

`live_server` (session) is daphne in a forked process serving HTTP and WebSockets on 127.0.0.1
against this run's test database (uvicorn, as ops.serving runs it, with SAPO_TEST_ASGI_SERVER=uvicorn);
tests/browser and tests/integration use it. `asgi_server` (session)
starts more of them: `with asgi_server(port=..., settings={...}, log_path=...) as server:` (settings
are applied in the server process only, e.g. another catalogue or limits; "CONN_MAX_AGE" sets the
database connection's; `log_path` gets the server's warnings and errors).
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if "huggingface_hub.constants" in sys.modules:  # imported before this file: switch it off too
    sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import factories` from any test folder

import factories  # noqa: E402

PASSWORD = factories.DEFAULT_PASSWORD


def pytest_configure(config: pytest.Config) -> None:
    # Tests serve static files from the finders; STATIC_ROOT exists only after collectstatic.
    config.addinivalue_line("filterwarnings", "ignore:No directory at:UserWarning")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    from django.conf import settings

    for alias in settings.DATABASES:
        db = settings.DATABASES[alias]
        test = db.setdefault("TEST", {})
        base = test.get("NAME") or f"test_{db['NAME']}"
        test["NAME"] = f"{base}_p{os.getpid()}"


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's, plus: before the test database is dropped, give back the connections that
    common.db's threads (and asgiref's sync thread) hold: each database thread keeps its connection
    between calls (common.db.KEEP_CONNECTION_SECONDS)."""
    yield
    from django.db import connections

    from common import db

    if db._threads is not None:
        db._threads.close_connections()
    # And the one asgiref's sync_to_async thread holds (tests call services through it).
    from asgiref.sync import SyncToAsync

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=60)
    with django_db_blocker.unblock():
        for connection in connections.all(initialized_only=True):
            connection.close_pool()


_limit_redis: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _fresh_swarm_places() -> None:
    """A process keeps each swarm's place a few seconds (sockets.swarm_places): a test's database (rolled
    back, or emptied after a transactional test) does not hold the previous test's swarms."""
    from sockets.swarm_places import places_forget

    places_forget()


@pytest.fixture(autouse=True)
def _fresh_abuse_limits() -> None:
    """Abuse-limit counters (accounts.limits: log-in failures, sign-ups, node creations, API throttles)
    start at zero in every test, as they would for a new client: the whole run comes from 127.0.0.1 and
    reuses usernames. The limits themselves stay on. In PostgreSQL the counters roll back with the test;
    in Redis they live under this run's own prefix (the one `_isolate_channel_layer` gives a live server
    too), emptied here."""
    from django.conf import settings

    settings.SAPO_REDIS_PREFIX = f"sapotest{os.getpid()}"
    if settings.REDIS_URL:
        import redis

        client = _limit_redis.get(settings.REDIS_URL)
        if client is None:
            client = _limit_redis[settings.REDIS_URL] = redis.Redis.from_url(settings.REDIS_URL)
        keys = [
            key
            for kind in ("limit", "budget")  # accounts.limits' counters, sockets.ratelimit's buckets
            for key in client.scan_iter(match=f"{settings.SAPO_REDIS_PREFIX}:{kind}:*", count=1000)
        ]
        if keys:
            client.delete(*keys)


@pytest.fixture
def password() -> str:
    return PASSWORD


@pytest.fixture
def user(db):
    return factories.make_user(username="alice", display_name="Alice")


@pytest.fixture
def other_user(db):
    return factories.make_user(username="bob", display_name="Bob")


@pytest.fixture
def node(user):
    """A node of `user`, named "laptop"."""
    return factories.make_node(owner=user, name="laptop")


@pytest.fixture
def node_token(node) -> str:
    """A valid plaintext token of `node`."""
    _, plaintext = factories.make_node_token(node=node)
    return plaintext


@pytest.fixture
def auth_client(client, user):
    """Django's test client, logged in as `user`."""
    client.force_login(user)
    return client


@pytest.fixture
def throttle_queries(settings) -> int:
    """Queries the REST API's throttle adds to a request: none with Redis (the counter lives there),
    one statement in PostgreSQL without it (accounts.limits.hit). A page's query count is its own plus
    this, the same for any number of rows."""
    return 0 if settings.REDIS_URL else 1


@pytest.fixture
def api_client(user):
    """DRF's APIClient with `user`'s session (CSRF enforced, as for a browser)."""
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_login(user)
    return api


# ---------------------------------------------------------------------------- a live ASGI server


def _asgi_application(settings_overrides: dict[str, Any] | None = None, log_path: Path | None = None):
    """What the server process runs: the project's ASGI router, with static files served from the
    finders (as runserver does; the test run has no collectstatic). Called in the server process,
    so `settings_overrides` change that process's settings only. With `log_path`, the process's log
    (warnings and errors, tracebacks included) is written there too."""
    import logging
    from concurrent.futures import ThreadPoolExecutor

    from asgiref.sync import SyncToAsync
    from channels.layers import channel_layers
    from django.conf import settings
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    # Each server has a presence name of its own (a test that restarts "the same server" names it).
    settings.SAPO_SERVER_NAME = f"test-server-{os.getpid()}"
    for name, value in (settings_overrides or {}).items():
        if name == "CONN_MAX_AGE":  # the database's (SAPO_CONN_MAX_AGE); the connection reads this dict
            settings.DATABASES["default"]["CONN_MAX_AGE"] = value
            if value:  # as in config/settings.py: persistent connections instead of the pool
                settings.DATABASES["default"]["OPTIONS"].pop("pool", None)
        else:
            setattr(settings, name, value)
    # The server is a fork of the test process, which may already have run consumers in process.
    # A fork copies objects but not threads: asgiref's single-thread executor would queue the
    # server's database calls for a worker thread that does not exist here, and inherited channel
    # layers hold Redis connections of the parent's event loops. Start both afresh.
    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    channel_layers.backends.clear()
    # Nor is the test process's multiprocessing fork server this process's child: starting a worker
    # through it (a swarm catalogue's bounded build, the scorers' sandbox) would wait on a process
    # that is not ours (ECHILD). Forget it, so this server starts its own, as a production server does.
    from multiprocessing import forkserver

    forkserver._forkserver._forkserver_pid = None
    forkserver._forkserver._forkserver_address = None
    forkserver._forkserver._forkserver_alive_fd = None

    from common.library_patches.daphne import follow_frame_limit
    from config.asgi import application
    from pool.limits import current_limits

    follow_frame_limit(current_limits().websocket_max_bytes)  # config.asgi may have been imported before the overrides
    if log_path is not None:  # after config.asgi: its first import sets logging up afresh (django.setup)
        handler = logging.FileHandler(log_path)
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(handler)
    return ASGIStaticFilesHandler(application)


class _NoSettings:
    """pytest-django's live-server helper toggles settings on this; nothing to toggle here."""

    def enable(self) -> None: ...

    def disable(self) -> None: ...


class AsgiLiveServer:
    def __init__(self, process) -> None:
        self.process = process
        self.host = "127.0.0.1"
        self.port = process.port.value
        self.url = f"http://{self.host}:{self.port}"
        self.ws_url = f"ws://{self.host}:{self.port}"
        self._live_server_modified_settings = _NoSettings()

    def __str__(self) -> str:
        return self.url


def _isolate_channel_layer() -> None:
    """Keep this run's channel-layer groups apart from other test runs sharing the same Redis."""
    from channels.layers import channel_layers
    from django.conf import settings

    settings.SAPO_REDIS_PREFIX = f"sapotest{os.getpid()}"  # rate-limit counters too
    layer = settings.CHANNEL_LAYERS.get("default", {})
    if "RedisChannelLayer" in layer.get("BACKEND", ""):
        config = layer.setdefault("CONFIG", {})
        prefix = f"asgitest{os.getpid()}"
        if config.get("prefix") != prefix:
            config["prefix"] = prefix
            channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def _no_outage_under_way() -> None:
    """common.outage's state is per process: an outage a test left "under way" must not hide the next
    test's first log line (or log its end)."""
    from common.outage import forget_outages

    forget_outages()


@pytest.fixture(scope="session", autouse=True)
def _isolated_redis_keys() -> None:
    """Redis keys (rate counts, presence, channel layer) apart from other test runs from the start:
    in-process consumers use them too, and node ids repeat across runs' databases."""
    _isolate_channel_layer()


@contextmanager
def _serve_asgi(
    django_db_blocker, *, port: int = 0, settings: dict[str, Any] | None = None, log_path: Path | None = None
) -> Iterator[AsgiLiveServer]:
    from daphne.testing import DaphneProcess
    from django.db import connections
    from support.uvicorn_process import UvicornProcess

    _isolate_channel_layer()
    with django_db_blocker.unblock():
        connections.close_all()  # the forked server must not share the parent's sockets
        for connection in connections.all(initialized_only=True):
            connection.close_pool()  # nor the pool's (the parent opens a new pool when it needs one)
        # Each test empties the database, the default swarm with it: a server reads swarms anew.
        settings = {"SAPO_SWARM_PLACE_SECONDS": 0.0, **(settings or {})}
        server_class = UvicornProcess if os.environ.get("SAPO_TEST_ASGI_SERVER") == "uvicorn" else DaphneProcess
        process = server_class(
            host="127.0.0.1", port=port, get_application=lambda: _asgi_application(settings, log_path)
        )
        # Not daemonic, as daphne is in production: a daemonic process may not start children, and the
        # server starts some (a swarm catalogue's bounded builds, the scorers' sandbox). The finally
        # below stops it.
        process.daemon = False
        process.start()
        if not process.ready.wait(30):
            process.terminate()
            if not process.errors.empty():
                _, trace = process.errors.get(False)
                raise RuntimeError(f"daphne did not start:\n{trace}")
            raise RuntimeError("daphne did not start within 30 s")
        server = AsgiLiveServer(process)
        try:
            yield server
        finally:
            process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()


@pytest.fixture(scope="session")
def live_server(django_db_setup, django_db_blocker) -> Iterator[AsgiLiveServer]:
    """Daphne serving HTTP and WebSockets against the test database (see the module docstring).
    Using it makes the test transactional (pytest-django's helper requests `transactional_db`), so
    rows the test writes are visible to the server and the other way round."""
    with _serve_asgi(django_db_blocker) as server:
        yield server


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker) -> Callable[..., AbstractContextManager[AsgiLiveServer]]:
    """`with asgi_server(port=0, settings=None, log_path=None) as server:` another live server, e.g. one
    to kill and restart on the same port, or one whose log a test reads. Tests using it need
    `@pytest.mark.django_db(transaction=True)`."""
    return lambda **kwargs: _serve_asgi(django_db_blocker, **kwargs)


# ---------------------------------------------------------------------------- the tiny models


@pytest.fixture(scope="session")
def tiny_cache_dir() -> Path:
    """The cache folder shared by the whole test run (and kept between runs)."""
    path = Path(os.environ.get("SAPO_TEST_CACHE") or Path(__file__).resolve().parents[1] / "var" / "test-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_policy(tiny_cache_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of the built-in "tiny" variant, warm-started, in eval mode.

    Shared by the whole session: a test that trains or otherwise changes it must use
    `tiny_policy_copy` (or a deep copy of its own) instead.
    """
    from sapo_node.tiny.cache import load_tiny

    return load_tiny("tiny", cache_dir=tiny_cache_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_mini_policy(tiny_cache_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of "tiny-mini" (another tokenizer: digits split); shared like tiny_policy."""
    from sapo_node.tiny.cache import load_tiny

    return load_tiny("tiny-mini", cache_dir=tiny_cache_dir, progress=False)


@pytest.fixture
def tiny_policy_copy(tiny_policy: tuple[Any, Any]) -> tuple[Any, Any]:
    """A private deep copy of `tiny_policy` that a test may train."""
    model, tokenizer = tiny_policy
    return copy.deepcopy(model), copy.deepcopy(tokenizer)
