"""One-way layers (docs/architecture.md): the import graph of the platform's apps, of the node client
and of the research harness, built from the source with `ast` (every import, module level or inside a
function), must have no circle, no import from a lower layer to a higher one, and no import of Django
or the platform from the node client."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORM = REPO / "platform"
NODE_CLIENT = REPO / "node_client"
#: (folder on sys.path, where its modules are): the research harness is a package at the repository root.
SOURCES = [(PLATFORM, PLATFORM), (NODE_CLIENT, NODE_CLIENT), (REPO, REPO / "research")]

#: Lowest first. An app may import its own layer's modules and any lower layer's, never a higher one.
LAYERS = [
    "sapo_node",
    "common",
    "prebuilt",
    "accounts",
    "swarms",
    "nodes",
    "pool",
    "moderation",
    "sockets",
    "community",
    "alerts",
    "figures",
    "audits",
    "web",
    "ops",
    "localswarm",
    "config",
    # The research harness drives the node client against the platform it starts: nothing imports it.
    "research",
]
#: What the node client must never import: the server side and its framework.
SERVER_SIDE = {"django", "channels", "daphne", "rest_framework", *LAYERS[1:-1]}


def _modules() -> dict[str, Path]:
    found = {}
    for root, folder in SOURCES:
        for path in folder.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[0] not in LAYERS or "migrations" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno  # "from pool import seams" names a module


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module -> modules it imports (among ours), and every import that breaks a layer rule."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    broken = []
    for name, path in modules.items():
        app = name.split(".")[0]
        for target, line in _imports(name, path):
            top = target.split(".")[0]
            where = f"{path.relative_to(REPO)}:{line} imports {target}"
            if app == "sapo_node" and top in SERVER_SIDE:
                broken.append(f"{where} (the node client imports nothing of the server)")
            elif top in LAYERS and LAYERS.index(top) > LAYERS.index(app):
                broken.append(f"{where} ({app} is below {top})")
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph, broken


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, if any (depth-first search)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _app_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    apps: dict[str, set[str]] = {}
    for module, targets in graph.items():
        app = module.split(".")[0]
        apps.setdefault(app, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != app)
    return apps


def test_no_import_goes_up_a_layer():
    _, broken = _graph()
    assert broken == []


def test_no_circle_between_apps():
    assert _cycle(_app_graph(_graph()[0])) is None


def test_no_circle_between_modules():
    assert _cycle(_graph()[0]) is None


def test_the_checks_see_what_they_must_refuse():
    # The graph is real: the pool imports the node client's protocol, moderation the pool's seam,
    # web the pool's signal, the research harness the node's round; and an upward import or a circle
    # would be caught.
    graph, _ = _graph()
    assert "sapo_node.protocol" in graph["sockets.messages"]
    assert "sapo_node.loop" in graph["research.swarm"]
    assert "pool.seams" in graph["moderation.apps"]
    assert "pool.signals" in graph["figures.stats"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_node_socket_is_an_entry_point():
    # The socket (sockets) parses, dispatches and closes; the ledger (pool) and everything else is
    # called by it, never calls it: only the ASGI wiring imports it.
    graph, _ = _graph()
    importers = {m.split(".")[0] for m, targets in graph.items() for t in targets if t.split(".")[0] == "sockets"}
    assert importers <= {"sockets", "config"}


def test_nothing_imports_the_research_harness():
    # The harness starts the platform from the checkout, so the wheel cannot carry it: a node client
    # or platform module that imported it would break outside the checkout.
    graph, _ = _graph()
    assert any(m.startswith("research.") for m in graph)
    importers = {m.split(".")[0] for m, targets in graph.items() for t in targets if t.split(".")[0] == "research"}
    assert importers <= {"research"}


def test_the_architecture_table_names_the_layers_in_their_order():
    """docs/architecture.md's layer table names every layer, lowest first, as LAYERS orders them."""
    lines = (REPO / "docs" / "architecture.md").read_text().splitlines()
    start = lines.index("| layer | what it holds | may import |") + 2
    rows = lines[start : lines.index("", start)]
    named = [name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])]
    assert named == LAYERS
