"""The server's changes to libraries' private internals (common.library_patches): each does what it
says, and `moved()` finds a change an upgrade has left behind, instead of the server silently running
the library's own path."""

import types

from common import library_patches
from common.library_patches import _inspect, autobahn, daphne, psycopg, psycopg_pool


def test_no_patched_internal_has_moved():
    """Fails when an upgrade of autobahn, daphne, psycopg or psycopg_pool moves what the server patches: the
    message names the library and what moved (then move the patch with it, or drop it)."""
    from config import asgi  # noqa: F401 - serving the site installs the frame layer's changes

    assert library_patches.moved() == []


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("stand_in")
    exec(compile(source, "stand_in", "exec"), module.__dict__)
    return module


def test_names_used_sees_globals_looked_up_in_methods_and_nested_code_only():
    module = _module(
        "def helper(): pass\n"
        "class Protocol:\n"
        "    def read(self):\n"
        "        return [masker(b) for b in self.chunks]\n"
        "    @property\n"
        "    def peer(self):\n"
        "        return hlval(self.address)\n"
    )
    used = _inspect.names_used_in_module(module)
    assert {"masker", "hlval", "chunks", "address"} <= used
    assert "hltype" not in used and "helper" not in used


def test_moved_names_a_global_autobahn_no_longer_looks_up(monkeypatch):
    """As if an upgrade had autobahn's frame reader call its masker through another module: the
    patched global would no longer be used, and moved() says so."""
    from autobahn.websocket import protocol

    def processData(self):  # noqa: N802 - autobahn's name
        return xormasker.create(self.mask)  # noqa: F821 - never called

    monkeypatch.setattr(protocol.WebSocketProtocol, "processData", processData)
    assert any("create_xor_masker" in what for what in autobahn.moved())
    assert any(what.startswith("autobahn: ") for what in library_patches.moved())


def test_moved_names_a_daphne_that_no_longer_decodes_text_itself(monkeypatch):
    from daphne.ws_protocol import WebSocketProtocol

    def onMessage(self, payload, isBinary):  # noqa: N802, N803 - autobahn's names
        self.application_queue.put_nowait({"type": "websocket.receive", "text": payload})

    monkeypatch.setattr(WebSocketProtocol, "onMessage", onMessage)
    assert any("decodes" in what for what in daphne.moved())


def test_moved_names_an_autobahn_option_that_is_gone(monkeypatch):
    from autobahn.websocket.protocol import WebSocketServerProtocol

    options = [name for name in WebSocketServerProtocol.CONFIG_ATTRS if name != "failByDrop"]
    monkeypatch.setattr(WebSocketServerProtocol, "CONFIG_ATTRS", options)
    assert any("failByDrop" in what for what in daphne.moved())


def test_moved_names_a_pool_that_keeps_its_check_elsewhere(monkeypatch):
    from psycopg_pool import ConnectionPool

    init = ConnectionPool.__init__

    def keeps_it_elsewhere(self, *args, check=None, **kwargs):
        init(self, *args, **kwargs)
        self._check_fn = check

    monkeypatch.setattr(ConnectionPool, "__init__", keeps_it_elsewhere)
    assert psycopg_pool.moved() == ["psycopg_pool.ConnectionPool no longer keeps its check argument as _check"]


def test_the_pool_check_is_set_once_and_a_pools_own_check_is_kept():
    from psycopg_pool import ConnectionPool

    def ours(connection):
        pass

    def theirs(connection):
        pass

    pool = ConnectionPool("", open=False)
    psycopg_pool.check_each_connection(pool, ours)
    assert pool._check is ours
    pool = ConnectionPool("", open=False, check=theirs)
    psycopg_pool.check_each_connection(pool, ours)
    assert pool._check is theirs


def test_the_utf8_check_is_installed_once_and_wraps_daphnes_own_handler():
    from daphne.ws_protocol import WebSocketProtocol

    from config import asgi  # noqa: F401 - serving the site installs it

    installed = WebSocketProtocol.onMessage
    daphne.validate_utf8_once()
    assert WebSocketProtocol.onMessage is installed and installed.decodes_once
    assert WebSocketProtocol.utf8validateIncoming is False
    assert "decode" in _inspect.names_used(installed)  # daphne's own, under the wrapper


def test_the_ops_check_warns_when_a_patch_no_longer_applies(monkeypatch):
    from ops.checks import library_patches_apply

    assert library_patches_apply(None) == []
    monkeypatch.setattr(library_patches, "moved", lambda: ["daphne: something moved"])
    (warning,) = library_patches_apply(None)
    assert warning.id == "ops.W004" and "daphne: something moved" in warning.msg


def test_autobahns_debug_text_is_made_only_when_logged_and_reads_the_same():
    from pprint import pformat

    from autobahn.websocket import protocol

    from config import asgi  # noqa: F401 - serving the site installs it

    options = [("openHandshakeTimeout", 5, "WebSocketFactory"), ("failByDrop", False, "WebSocketProtocol")]
    made = protocol.pformat(options)
    assert not isinstance(made, str)  # nothing formatted yet
    assert f"{made}" == str(made) == pformat(options)
    timings = protocol.Timings()
    timings.track("handshake")
    assert str(timings) == pformat(timings._timings)  # a __str__ still gets a string


def test_autobahns_coloured_names_in_debug_lines_are_made_only_when_logged_and_read_the_same():
    from autobahn import util
    from autobahn.twisted import websocket as twisted_websocket
    from autobahn.websocket import protocol

    from config import asgi  # noqa: F401 - serving the site installs it

    for module in (protocol, twisted_websocket):
        name, value = module.hltype(test_no_patched_internal_has_moved), module.hlval(1234)
        assert not isinstance(name, str) and not isinstance(value, str)  # nothing formatted yet
        assert f"{name}" == str(name) == util.hltype(test_no_patched_internal_has_moved)
        assert f"{value:>10}" == format(util.hlval(1234), ">10")


def test_frames_are_unmasked_by_websockets_the_same_as_by_autobahn_chunk_after_chunk():
    import random

    from autobahn.websocket import protocol
    from autobahn.websocket.xormasker import create_xor_masker

    from config import asgi  # noqa: F401 - serving the site installs it

    rng = random.Random(7)
    for size in (0, 1, 5, 127, 128, 1000, 70_001):
        mask, data = rng.randbytes(4), rng.randbytes(size)
        ours, theirs = protocol.create_xor_masker(mask, size), create_xor_masker(mask, size)
        assert type(ours).__name__ == "_Unmasker"
        cuts = sorted({0, size, *(rng.randrange(size + 1) for _ in range(4))})
        for a, b in zip(cuts, cuts[1:], strict=False):  # as TCP delivers it: a frame in pieces
            assert ours.process(data[a:b]) == theirs.process(data[a:b])
            assert ours.pointer() == b
        ours.reset()
        assert ours.pointer() == 0 and ours.process(data) == create_xor_masker(mask, size).process(data)


def test_the_pools_reconnection_waits_are_capped():
    """psycopg_pool doubles its wait between reconnection attempts (1, 2, 4, ... s, up to its reconnect
    timeout): capped, a database that comes back is tried within the cap."""
    from psycopg_pool.base import AttemptWithBackoff

    previous = getattr(AttemptWithBackoff, "SAPO_MAX_DELAY", None)
    try:
        psycopg_pool.cap_reconnect_backoff(1.5)
        attempt, now = AttemptWithBackoff(timeout=300.0), 0.0
        waits = []
        for _ in range(10):
            attempt.update_delay(now)
            waits.append(attempt.delay)
            now += attempt.delay
        assert max(waits) == 1.5 and waits[0] <= 1.1 and sum(waits) > 10
        psycopg_pool.cap_reconnect_backoff(0.5)  # installed once; the cap can change
        attempt.update_delay(now)
        assert attempt.delay == 0.5
    finally:
        from django.conf import settings

        psycopg_pool.cap_reconnect_backoff(previous if previous is not None else settings.SAPO_DB_RECONNECT_SECONDS)


def test_moved_names_a_psycopg_whose_statement_conversion_no_longer_reads_the_cache_limit(monkeypatch):
    from psycopg import _queries

    def convert(self, query, vars):
        self.query = _query2pg_nocache(query, self._tx.encoding)  # noqa: F821 - never called

    assert psycopg.moved() == []
    monkeypatch.setattr(_queries.PostgresQuery, "convert", convert)
    assert psycopg.moved() == ["psycopg._queries.PostgresQuery.convert no longer reads MAX_CACHED_STATEMENT_LENGTH"]
    assert any(what.startswith("psycopg: ") for what in library_patches.moved())


def test_psycopgs_cache_limit_is_raised_and_never_lowered(monkeypatch):
    from psycopg import _queries

    from common.db import STATEMENT_CACHE_BYTES

    assert _queries.MAX_CACHED_STATEMENT_LENGTH == STATEMENT_CACHE_BYTES  # common.db installs it
    monkeypatch.setattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
    psycopg.cache_statements_up_to(10_000)
    assert _queries.MAX_CACHED_STATEMENT_LENGTH == 10_000
    psycopg.cache_statements_up_to(100)
    assert _queries.MAX_CACHED_STATEMENT_LENGTH == 10_000
