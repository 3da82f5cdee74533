"""Fixtures of the integration tests: real nodes (the built-in tiny models and the real
WebSocketTransport) against the real platform (daphne, the pool consumer, PostgreSQL, Redis) on
loopback.

- `swarm_server` (session): a live server like `live_server` (tests/conftest.py), but serving the
  `easy` catalogue (the tiny models earn rewards there, so their groups carry signal and become
  sampleable), at most 8 groups per share frame (several frames per round, so a cut can fall between
  them) and a rate limit no test reaches (the Redis counter is keyed by node id, which other test
  runs on the same Redis reuse). `swarm_servers(port=...)` starts one of its own (to kill and restart).
- `tiny_policy`, `tiny_mini_policy` (session): the built-in models, warm-started and cached in
  var/test-cache like tests/node's; shared, so a node trains a deep copy.
- `transports(url, token, path, **kw)`: WebSocketTransports with fast test backoff, closed at teardown.
- `proxies(port)`: CutProxy instances (cut_proxy.py) in front of a server, stopped at teardown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if "huggingface_hub.constants" in sys.modules:  # imported before this file: switch it off too
    sys.modules["huggingface_hub.constants"].HF_HUB_OFFLINE = True

import pytest  # noqa: E402
from cut_proxy import CutProxy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

SWARM_SETTINGS = {
    "SAPO_CATALOGUE": "easy",
    "SAPO_LIMITS": {"max_groups_per_message": 8, "max_messages_per_minute": 1_000_000},
}
#: Reconnect fast: the tests cut connections on purpose.
FAST = {"backoff_min": 0.05, "backoff_max": 0.3, "poll_interval": 0.1, "open_timeout": 5.0}


@pytest.fixture(scope="session")
def swarm_server(asgi_server):
    with asgi_server(settings=SWARM_SETTINGS) as server:
        yield server


@pytest.fixture(scope="session")
def swarm_servers(asgi_server) -> Callable[..., Any]:
    """`with swarm_servers(port=0) as server:` a server of its own, set up like swarm_server (to kill)."""
    return lambda **kwargs: asgi_server(settings=SWARM_SETTINGS, **kwargs)


@pytest.fixture(scope="session")
def tiny_cache_dir() -> Path:
    path = Path(os.environ.get("SAPO_TEST_CACHE") or REPO / "var" / "test-cache")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_policy(tiny_cache_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of "tiny"; shared: train a `policy_copy` of it."""
    from sapo_node.tiny import load_tiny

    return load_tiny("tiny", cache_dir=tiny_cache_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_mini_policy(tiny_cache_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of "tiny-mini" (another tokenizer: digits split); shared like tiny_policy."""
    from sapo_node.tiny import load_tiny

    return load_tiny("tiny-mini", cache_dir=tiny_cache_dir, progress=False)


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
