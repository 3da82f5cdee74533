"""Fixtures of the integration tests: real nodes (the built-in tiny models and the real
WebSocketTransport) against the real platform (daphne, the pool consumer, PostgreSQL, Redis) on
loopback.

- `swarm_server` (session): a live server like `live_server` (tests/conftest.py), but serving the
  `easy` catalogue (the tiny models earn rewards there, so their groups carry signal and become
  sampleable), at most 8 groups per share frame (several frames per round, so a cut can fall between
  them) and a rate limit no test reaches (the Redis counter is keyed by node id, which other test
  runs on the same Redis reuse). `swarm_servers(port=...)` starts one of its own (to kill and restart).
- `tiny_policy`, `tiny_mini_policy` (session, tests/conftest.py): the built-in models; shared, so a
  node trains a deep copy.
- the nodes' SAPO_CACHE is the run's model cache (tiny_cache_dir), as for the fixtures' models.
- `transports(url, token, path, **kw)`: WebSocketTransports with fast test backoff, closed at teardown.
- `proxies(port)`: CutProxy instances (cut_proxy.py) in front of a server, stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cut_proxy import CutProxy

REPO = Path(__file__).resolve().parents[2]

SWARM_SETTINGS = {
    "SAPO_CATALOGUE": "easy",
    "SAPO_LIMITS": {"max_groups_per_message": 8, "max_messages_per_minute": 1_000_000},
}
#: Reconnect fast: the tests cut connections on purpose.
FAST = {"backoff_min": 0.05, "backoff_max": 0.3, "poll_interval": 0.1, "open_timeout": 5.0}


@pytest.fixture(autouse=True)
def _node_cache(monkeypatch, tiny_cache_dir: Path) -> None:
    """The nodes' model cache (SAPO_CACHE) is the test run's, where the built-in models are built once.
    A node's first weights are always audited, and its upload is their difference from the base model
    it loads from that cache: with the home directory's empty cache it would build the base first
    (a warm start of a minute or more of CPU), while the test waits on its flush."""
    monkeypatch.setenv("SAPO_CACHE", str(tiny_cache_dir))


@pytest.fixture(autouse=True)
def _easy_default_swarm(request) -> None:
    """The servers here serve the `easy` catalogue (SWARM_SETTINGS) to nodes that name no swarm: the
    site's default swarm has it (a default swarm made by a server is made from its SAPO_CATALOGUE; one
    the test database's migration made, from the tests' settings, gets it as its next version)."""
    if request.node.get_closest_marker("django_db") is None:
        return
    request.getfixturevalue("transactional_db")
    from factories import make_user

    from sapo_node.tasks import CATALOGUES
    from swarms.catalogue import entries_of_catalogue
    from swarms.selectors import swarm_catalogue
    from swarms.services import swarm_catalogue_set, swarm_default_ensure

    swarm = swarm_default_ensure()
    easy = entries_of_catalogue(CATALOGUES[SWARM_SETTINGS["SAPO_CATALOGUE"]])
    if swarm_catalogue(swarm=swarm).entries != easy:
        swarm_catalogue_set(actor=make_user(is_staff=True), swarm=swarm, entries=easy, reason="the tests' catalogue")


@pytest.fixture(scope="session")
def swarm_server(asgi_server):
    with asgi_server(settings=SWARM_SETTINGS) as server:
        yield server


@pytest.fixture(scope="session")
def swarm_servers(asgi_server) -> Callable[..., Any]:
    """`with swarm_servers(port=0, settings=None) as server:` a server of its own, set up like
    swarm_server (to kill); `settings` are added to SWARM_SETTINGS."""
    return lambda settings=None, **kwargs: asgi_server(settings=SWARM_SETTINGS | (settings or {}), **kwargs)


@pytest.fixture
def transports() -> Iterator[Callable[..., Any]]:
    from sapo_node.transport.websocket import WebSocketTransport

    made: list[WebSocketTransport] = []

    def make(url: str, token: str | None, path: Path, **kwargs: Any) -> WebSocketTransport:
        transport = WebSocketTransport(url, token, path, **(FAST | kwargs))
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.close()  # again if the test closed it: harmless


@pytest.fixture
def proxies() -> Iterator[Callable[[int], CutProxy]]:
    made: list[CutProxy] = []

    def make(port: int) -> CutProxy:
        proxy = CutProxy(port).start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.stop()
