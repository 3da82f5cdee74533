"""No SQL in platform/ is built by string formatting: statements are composed from parts with
psycopg's `sql` module (common.composed) or written by the ORM. Walks every module's syntax tree
(migrations aside) for an f-string, a `%` format, a `+` concatenation, or a `.format` / `.format_map`
/ `.replace` / `.join` call whose string parts read as SQL, and for a `# noqa: S608` (the linter's
SQL-injection warning silenced)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PLATFORM = Path(__file__).resolve().parents[2] / "platform"

#: A string part reads as SQL when it holds a statement's or a clause's keyword, upper case as this
#: project writes SQL (a sentence such as "Select a swarm from the list" does not match).
_SQL_WORDS = re.compile(
    r"\b(?:SELECT|INSERT\s+INTO|UPDATE\s+\w+|DELETE\s+FROM|WITH\s+\w+\s+AS|WHERE|JOIN|GROUP\s+BY|ORDER\s+BY"
    r"|RETURNING|ON\s+CONFLICT|UNION|VALUES\s*\(|FOR\s+(?:NO\s+KEY\s+)?UPDATE)\b"
)
_STRING_CALLS = {"format", "format_map", "replace", "join"}
_NOQA_S608 = re.compile(r"#\s*noqa\b[^#]*\bS608\b")


def _reads_as_sql(text: str) -> bool:
    return bool(_SQL_WORDS.search(text))


class _Finder(ast.NodeVisitor):
    """Finds statements built from text parts in one module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.sql_names: set[str] = set()  # names bound to a string that reads as SQL

    def _texts(self, node: ast.AST) -> list[str]:
        """The literal text of a string expression (a constant, an f-string's literal parts), or of a
        name bound to one; [] for anything else."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
        if isinstance(node, ast.Name) and node.id in self.sql_names:
            return ["SELECT"]
        return []

    def _sql(self, node: ast.AST) -> bool:
        return any(map(_reads_as_sql, self._texts(node)))

    def _operands(self, node: ast.AST) -> list[ast.AST]:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._operands(node.left) + self._operands(node.right)
        return [node]

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Constant | ast.JoinedStr) and self._sql(node.value):
            self.sql_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        value = node.value
        if isinstance(node.target, ast.Name) and isinstance(value, ast.Constant | ast.JoinedStr) and self._sql(value):
            self.sql_names.add(node.target.id)
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if self._sql(node):
            self.found.append((node.lineno, "f-string"))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mod) and self._sql(node.left):
            self.found.append((node.lineno, "% format"))
        elif isinstance(node.op, ast.Add) and any(map(self._sql, self._operands(node))):
            self.found.append((node.lineno, "+ concatenation"))
            return  # one finding per chain of +
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.Add) and (self._sql(node.value) or self._sql(node.target)):
            self.found.append((node.lineno, "+= concatenation"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _STRING_CALLS:
            parts = [func.value] + (list(node.args) if func.attr == "join" else [])
            if any(map(self._sql, parts)):
                self.found.append((node.lineno, f".{func.attr}()"))
        self.generic_visit(node)


def sql_from_text(source: str) -> list[tuple[int, str]]:
    """(line, how) for every statement `source` builds from text parts, in line order."""
    finder = _Finder()
    tree = ast.parse(source)
    # Module-level names first, so a use above the binding's line is seen too.
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            finder.visit(node)
    finder.found.clear()
    finder.visit(tree)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and _NOQA_S608.search(token.string):
            finder.found.append((token.start[0], "noqa: S608"))
    return sorted(set(finder.found))


def _modules() -> list[Path]:
    return sorted(p for p in PLATFORM.rglob("*.py") if "migrations" not in p.relative_to(PLATFORM).parts)


def _offenders() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in _modules():
        hits = sql_from_text(path.read_text(encoding="utf-8"))
        if hits:
            found[str(path.relative_to(PLATFORM.parent))] = hits
    return found


def test_no_sql_in_platform_is_built_from_text():
    offenders = _offenders()
    assert offenders == {}, "compose these with psycopg's sql module (common.composed) or the ORM"


@pytest.mark.parametrize(
    ("source", "how"),
    [
        ('def f(t):\n    return f"SELECT id FROM {t}"\n', "f-string"),
        ('def f(c):\n    return "SELECT id FROM pool_rollout WHERE %s" % c\n', "% format"),
        ('def f(c):\n    return "SELECT id FROM pool_rollout WHERE {}".format(c)\n', ".format()"),
        ('def f(c):\n    return "SELECT id FROM pool_rollout" + c\n', "+ concatenation"),
        ('def f(c):\n    return c + " AND x = 1" + " ORDER BY id"\n', "+ concatenation"),
        ('def f(c):\n    q = "x"\n    q += " WHERE y = 1"\n    return q\n', "+= concatenation"),
        (
            '_SQL = """\nWITH a AS (SELECT 1){record}\nSELECT 2"""\n\n\ndef f(r):\n    return _SQL.replace("{record}", r)\n',
            ".replace()",
        ),
        ('def f(r):\n    return _SQL.format(record=r)\n\n\n_SQL = "SELECT 1 {record}"\n', ".format()"),
        ('def f(cols):\n    return " UNION ".join(cols)\n', ".join()"),
        ("def f(cursor, s):\n    cursor.execute(s)  # noqa: S608 - trusted\n", "noqa: S608"),
        ('def f(cursor, t):\n    cursor.execute(f"""\n    DELETE FROM {t}\n    """)\n', "f-string"),
    ],
)
def test_each_way_of_building_sql_from_text_is_found(source, how):
    assert [h for _, h in sql_from_text(source)] == [how]


@pytest.mark.parametrize(
    "source",
    [
        # Composed: the way statements are built.
        'from psycopg import sql\nQ = sql.SQL("SELECT {} FROM {}").format(sql.Identifier("id"), sql.Identifier("t"))\n',
        'from psycopg import sql\nQ = sql.SQL("SELECT 1") + sql.SQL(" UNION SELECT 2")\n',
        # A whole statement as one literal, its values bound.
        'def f(cursor, n):\n    cursor.execute("SELECT id FROM nodes_node WHERE id = %s", [n])\n',
        # Messages and text for people, upper case or not.
        'def f(n):\n    return f"Select a swarm from the list ({n} open), then update your node."\n',
        'def f(n):\n    return "select %s from the menu" % n\n',
        'def f(names):\n    return ", ".join(names) + " joined"\n',
        'def f(n):\n    return "the node {} was seen".format(n)\n',
    ],
)
def test_composed_statements_and_messages_are_not_found(source):
    assert sql_from_text(source) == []


def test_placeholder_names_are_read_from_the_composed_structure():
    """common.composed.placeholder_names, which RecordSql's check uses: a Composed's parts, nested, and
    each Placeholder's name; a parameter hidden in a text part is refused."""
    from psycopg import sql

    from common.composed import placeholder_names, placeholders

    inner = sql.SQL("b = {b}").format(**placeholders(binary=("b",)))
    query = sql.SQL("SELECT {a} FROM t WHERE {inner}").format(inner=inner, **placeholders("a"))
    assert placeholder_names(query) == {"a", "b"}
    assert query.as_string(None) == "SELECT %(a)s FROM t WHERE b = %(b)b"
    with pytest.raises(ValueError, match="written into SQL text"):
        placeholder_names(sql.SQL("SELECT %(a)s"))
    with pytest.raises(ValueError, match="positional"):
        placeholder_names(sql.SQL("SELECT {}").format(sql.Placeholder()))
