"""How a node talks to the swarm. The training loop sees only the `Transport` interface (base.py);
`SiloTransport` trains alone, `MemoryTransport` shares an in-process pool (tests, experiments) and
`WebSocketTransport` talks to the platform from a background thread."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from sapo_node.transport.base import Hello, Preparing, SiloTransport, Transport, TransportCounts
from sapo_node.transport.memory import MemoryPool, MemoryTransport

if TYPE_CHECKING:
    from sapo_node.config import NodeConfig

__all__ = [
    "Hello",
    "MemoryPool",
    "MemoryTransport",
    "Preparing",
    "SiloTransport",
    "Transport",
    "TransportCounts",
    "make_transport",
]

#: The outbox of a run, inside --out.
OUTBOX_FILE = "outbox.sqlite3"


def make_transport(config: NodeConfig, out: Path) -> Transport:
    """The transport a config asks for: silo when offline, else the platform's WebSocket."""
    if config.offline:
        return SiloTransport()
    if not config.server:
        raise ValueError("no server: give --server URL (or SAPO_SERVER), or --offline to train alone")
    from sapo_node.transport.websocket import WebSocketTransport  # only a connected node needs websockets

    return WebSocketTransport(
        node_endpoint(config.server), config.token, Path(out) / OUTBOX_FILE, buffer_size=2 * config.external
    )


def node_endpoint(server: str) -> str:
    """The node WebSocket URL for what a user typed: the site's address (http or ws, with or
    without a path) or the endpoint itself. `https://sapo.example.org` -> `wss://sapo.example.org/ws/node/`."""
    parts = urlsplit(server.strip())
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    if scheme not in ("ws", "wss") or not parts.netloc:
        raise ValueError(f"--server must be a ws://, wss://, http:// or https:// address, not {server!r}")
    path = parts.path if parts.path not in ("", "/") else "/ws/node/"
    return urlunsplit((scheme, parts.netloc, path, parts.query, ""))
