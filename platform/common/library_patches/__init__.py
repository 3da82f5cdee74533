"""Every change the server makes to a library's private internals, one module per library.

- `autobahn` (WebSocket frames, under daphne): debug text made only when a log line uses it; frames
  unmasked by `websockets`' C `apply_mask`.
- `daphne` (its WebSocket protocol class): the protocol's frame limit instead of daphne's own, a
  close code instead of a dropped connection, a text message's UTF-8 checked once; (its HTTP request,
  Twisted's) a request refused on its headers answered before its body is read.
- `psycopg` (its statement conversion): statements up to common.db's STATEMENT_CACHE_BYTES keep their
  converted placeholders in psycopg's cache (installed by common.db).
- `psycopg_pool` (the pool Django makes): each connection checked before it is handed out
  (common.pg_lost).

Each change relies on where the library keeps what it changes: a module global looked up at call
time, what a method's code does, an attribute a constructor sets. An upgrade that moves one would
leave the server on the library's own path, slower or wrong, without a word. So each module says
what it relies on in `moved()`, which names whatever is no longer where it was: `install` logs it at
start-up, `manage.py check` warns (ops.W004) and tests/platform/test_library_patches.py fails.
"""

from __future__ import annotations

import logging

from common.library_patches import autobahn, daphne, psycopg, psycopg_pool

logger = logging.getLogger(__name__)

LIBRARIES = (autobahn, daphne, psycopg, psycopg_pool)


def moved() -> list[str]:
    """What a patched library no longer keeps where its patch expects it, as "library: what"."""
    return [f"{library.__name__.rpartition('.')[2]}: {what}" for library in LIBRARIES for what in library.moved()]


def install_for_serving(websocket_max_bytes: int, body_check: daphne.BodyCheck | None = None) -> None:
    """What a server process changes before it serves (config.asgi): daphne's and autobahn's frame
    handling, and the requests daphne answers before reading their body (`body_check`). The database
    pool's check is installed by the database backend (config.pg_backend)."""
    daphne.follow_frame_limit(websocket_max_bytes)
    if body_check is not None:
        daphne.refuse_bodies_early(body_check)
    daphne.validate_utf8_once()
    autobahn.format_debug_lazily()
    autobahn.unmask_with_websockets()
    for what in moved():
        logger.warning("a library upgrade moved what the server patches, so its own path runs: %s", what)
