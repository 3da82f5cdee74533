"""One protocol vocabulary for both sides (sapo_node.protocol): the server's error codes and limit
defaults are the module's, the node client reacts to the module's codes and handles every server
message, neither side writes a message type or a close code as a literal, and docs/protocol.md lists
the same codes and defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pool.limits import Limits
from sapo_node import protocol
from sapo_node.transport import websocket

REPO = Path(__file__).resolve().parents[2]
PROTOCOL_DOC = (REPO / "docs" / "protocol.md").read_text()


def _table_rows(after_header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line is `after_header`, as lists of cells."""
    lines = PROTOCOL_DOC.splitlines()
    start = lines.index(after_header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_error_table_of_the_docs_lists_the_protocols_codes_in_order():
    documented = [re.match(r"`(\w+)`", row[0]).group(1) for row in _table_rows("| code | when |")]
    assert documented == list(protocol.ERROR_CODES)


def test_the_limits_table_of_the_docs_gives_the_protocols_defaults():
    rows = _table_rows("| limit | variable | default |")
    documented = {re.match(r"`(\w+)`", row[0]).group(1): int(row[2].split()[0]) for row in rows}
    assert documented == protocol.DEFAULT_LIMITS


def test_the_servers_limits_default_to_the_protocols():
    assert Limits().to_json() == protocol.DEFAULT_LIMITS
    assert tuple(Limits().to_json()) == protocol.LIMIT_NAMES


def _error_codes_written_in(path: Path) -> list[tuple[int, str]]:
    """(line, code) of every code written in `path` as the first argument of ProtocolError(...) or
    of a consumer's `_error(...)`: a literal string, or protocol.<NAME>."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name not in ("ProtocolError", "_error"):
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.append((node.lineno, first.value))
        elif isinstance(first, ast.Attribute) and getattr(first.value, "id", None) == "protocol":
            found.append((node.lineno, getattr(protocol, first.attr)))
    return found


def test_every_error_code_the_server_sends_is_the_protocols():
    written = {
        (path.name, line, code)
        for app in ("pool", "sockets")
        for path in sorted((REPO / "platform" / app).glob("*.py"))
        for line, code in _error_codes_written_in(path)
    }
    assert any(name == "messages.py" for name, _, _ in written)  # the parser's codes were read
    assert [w for w in written if w[2] not in protocol.ERROR_CODES] == []


def test_the_node_client_reacts_to_the_protocols_codes_and_handles_every_server_message():
    assert websocket.FATAL_SHARE_ERRORS <= set(protocol.ERROR_CODES)
    assert set(websocket.BACKOFF_ERRORS) <= set(protocol.ERROR_CODES)
    assert not websocket.FATAL_SHARE_ERRORS & set(websocket.BACKOFF_ERRORS)
    assert set(websocket.WebSocketTransport._ON_SERVER_MESSAGE) == set(protocol.SERVER_MESSAGES)
    assert websocket.DEFAULT_LIMITS == {name: protocol.DEFAULT_LIMITS[name] for name in websocket.SHAPE_LIMITS}


#: Where the protocol is spoken: the server's socket (its consumer, the frames' parser, closes), the
#: pool's verdicts, the closes nodes.events sends, and the node client's transports.
SPEAKERS = sorted(
    [
        *(REPO / "platform" / "sockets").glob("*.py"),
        *(REPO / "platform" / "pool").glob("*.py"),
        REPO / "platform" / "nodes" / "events.py",
        *(REPO / "node_client" / "sapo_node" / "transport").glob("*.py"),
    ]
)
MESSAGE_TYPES = set(protocol.NODE_MESSAGES) | set(protocol.SERVER_MESSAGES)


def _vocabulary_literals(source: str) -> list[tuple[int, object]]:
    """(line, value) of each message type or close code written as a literal in `source`: an int in
    the applications' close-code range (4000-4999, RFC 6455 7.4.2), a string as the "type" or "for"
    of a dict (a frame), as the kind given to `frame(...)`, or a message type compared with anything."""
    found: list[tuple[int, object]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and type(node.value) is int and 4000 <= node.value <= 4999:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and key.value in ("type", "for")
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    found.append((value.lineno, value.value))
        elif isinstance(node, ast.Call) and node.args:
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            first = node.args[0]
            if name == "frame" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((first.lineno, first.value))
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                for item in items:
                    if isinstance(item, ast.Constant) and item.value in MESSAGE_TYPES:
                        found.append((item.lineno, item.value))
    return found


@pytest.mark.parametrize(
    "line",
    [
        'reply = {"type": "ack", "for": "share", "accepted": []}',
        'reply = {"type": "welcome"}',
        "await self.close(code=4401)",
        "code = code if isinstance(code, int) else 4403",
        'await self._send(ws, protocol.frame("sample", n=2))',
        'if frame.get("type") == "samples": pass',
        'if kind in ("error", protocol.ACK): pass',
    ],
)
def test_a_message_type_or_close_code_written_as_a_literal_is_seen(line):
    assert _vocabulary_literals(line) != []
    assert _vocabulary_literals(line.replace('"', "'")) != []


def test_the_server_and_the_client_write_message_types_and_close_codes_by_their_protocol_names():
    read = {path.relative_to(REPO).as_posix() for path in SPEAKERS}
    assert {"platform/sockets/consumers.py", "node_client/sapo_node/transport/websocket.py"} <= read
    written = [
        (path.relative_to(REPO).as_posix(), line, value)
        for path in SPEAKERS
        for line, value in _vocabulary_literals(path.read_text())
    ]
    assert written == []


def test_the_protocol_module_names_each_constant_once():
    """A name assigned twice (a swarm's state and an error code both called SWARM_PAUSED) silently
    gives both sides the second value."""
    tree = ast.parse(Path(protocol.__file__).read_text())
    names = [
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    ]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
