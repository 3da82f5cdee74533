"""The node protocol's shared vocabulary (docs/protocol.md): version, message types, close codes and
limit names, one module for the node client and the server (pool.messages, pool.consumers,
pool.limits, nodes.events and config.settings import it). Plain constants, no dependencies: the server
imports it, and it imports nothing of the server's (tests/test_layers.py checks both)."""

from __future__ import annotations

#: The limits the server announces in `welcome.limits` (pool.limits.Limits has exactly these fields; a
#: deployment sets each with the variable SAPO_<NAME>, read once in config/settings.py).
LIMIT_NAMES = (
    "max_frame_bytes",
    "max_groups_per_message",
    "max_completions_per_group",
    "max_chars_per_completion",
    "max_sample_n",
    "max_used_per_report",
    "max_messages_per_minute",
    "max_bytes_per_minute",
    "max_cpu_ms_per_minute",
    "max_consecutive_errors",
    "sample_window_seconds",
    "max_stored_bytes_per_node_hour",
    "max_stored_bytes_per_contributor_hour",
)

#: The protocol version every frame carries as "v"; a frame with another is answered `unsupported_version`.
VERSION = 1

# Message types, node -> server.
HELLO = "hello"
SHARE = "share"
SAMPLE = "sample"
REPORT = "report"
NODE_MESSAGES = (HELLO, SHARE, SAMPLE, REPORT)

# Message types, server -> node ("ack" carries "for": SHARE or REPORT).
WELCOME = "welcome"
ACK = "ack"
SAMPLES = "samples"
ERROR = "error"
SERVER_MESSAGES = (WELCOME, ACK, SAMPLES, ERROR)

# WebSocket close codes the server uses (and HTTP statuses at the upgrade map onto the first two).
CLOSE_UNAUTHENTICATED = 4401  # no/bad token, tokens revoked, node retired: retrying cannot help
CLOSE_BANNED = 4403  # the node or its contributor is banned
CLOSE_TOO_MANY_ERRORS = 4429  # max_consecutive_errors error replies in a row
CLOSE_TRY_AGAIN = 4503  # the server could not open the session now (its database or Redis failed): retry later
#: Every close code the server sends itself. An application may send only 1000 or 3000-4999 (RFC 6455
#: 7.4.2; autobahn, under daphne, raises on any other, e.g. 1011, and the node then gets daphne's
#: own 1011 for an unhandled exception instead); tests/platform/test_close_codes.py holds them to it.
SERVER_CLOSE_CODES = (CLOSE_UNAUTHENTICATED, CLOSE_BANNED, CLOSE_TOO_MANY_ERRORS, CLOSE_TRY_AGAIN)
#: HTTP answers to the upgrade after which retrying cannot help. Not 403: daphne answers 403 to a
#: handshake its application did not accept within --websocket_connect_timeout (a server busy with a
#: crowd of reconnecting nodes), and the platform refuses a banned node after accepting (close 4403).
HTTP_REFUSALS = {401: CLOSE_UNAUTHENTICATED}


def frame(kind: str, **fields: object) -> dict[str, object]:
    """A frame of this protocol version: {"type": kind, "v": VERSION, **fields}."""
    return {"type": kind, "v": VERSION, **fields}
