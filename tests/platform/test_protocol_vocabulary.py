"""One protocol vocabulary for both sides (sapo_node.protocol): the server's error codes and limit
defaults are the module's, the node client reacts to the module's codes and handles every server
message, and docs/protocol.md lists the same codes and defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

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


def test_every_error_code_the_pool_sends_is_the_protocols():
    written = {
        (path.name, line, code)
        for path in sorted((REPO / "platform" / "pool").glob("*.py"))
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
