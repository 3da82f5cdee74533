"""SQL composed as structure, with psycopg's `sql` module: statements are built from `sql.SQL` text
parts, `sql.Identifier` names and `sql.Placeholder` parameters, never by string formatting
(tests/platform/test_sql_composed.py fails on a statement built with `+`, `%`, `.format` on a string or
an f-string). Values are always bound parameters, arrays included.

Composing happens once, at import (or at first use, for a statement that depends on something known
only then): psycopg renders a Composable at every execution, so the statements every share or socket
runs are rendered to their text once (`rendered`) and executed as that text, which also keeps
psycopg's per-text caches (placeholder conversion, prepared statements) working as for a literal."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from psycopg import sql
from psycopg.adapt import PyFormat


def placeholders(*names: str, binary: Iterable[str] = ()) -> dict[str, sql.Placeholder]:
    """Named placeholders for `sql.SQL(...).format(**...)`: `names` as `%(name)s` (any format, text
    or binary as psycopg chooses) and `binary` as `%(name)b` (binary: the arrays, whose text format
    costs an escape per element)."""
    found = {name: sql.Placeholder(name) for name in names}
    found.update({name: sql.Placeholder(name, PyFormat.BINARY) for name in binary})
    return found


def cte_list(ctes: Mapping[str, sql.Composable], materialized: Iterable[str] = ()) -> sql.Composed:
    """`name AS (body), ...` for a WITH: the common table expressions in the mapping's order, those
    named in `materialized` as `AS MATERIALIZED` (PostgreSQL computes them once, as a fence)."""
    fenced = frozenset(materialized)
    unknown = fenced - set(ctes)
    if unknown:
        raise ValueError(f"materialized CTEs not in the list: {sorted(unknown)}")
    return sql.SQL(",\n").join(
        sql.SQL("{} AS MATERIALIZED ({})" if name in fenced else "{} AS ({})").format(sql.Identifier(name), body)
        for name, body in ctes.items()
    )


def _parts(query: sql.Composable) -> Iterator[sql.Composable]:
    if isinstance(query, sql.Composed):  # iterable over its parts
        for part in query:
            yield from _parts(part)
    else:
        yield query


def placeholder_names(query: sql.Composable) -> set[str]:
    """The names of the `sql.Placeholder` parameters a composed statement takes, read from its
    structure (a placeholder renders alone as `%(name)s` or `%(name)b`). Raises ValueError for a
    positional placeholder, or for a `%(` written into an `sql.SQL` text part, which would take a
    parameter no structure declares."""
    names = set()
    for part in _parts(query):
        if isinstance(part, sql.Placeholder):
            alone = part.as_string(None)
            if not alone.startswith("%("):
                raise ValueError("a positional placeholder where names are declared")
            names.add(alone[2:-2])
        elif isinstance(part, sql.SQL) and "%(" in part.as_string(None):
            raise ValueError(f"a parameter written into SQL text, not a Placeholder: {part.as_string(None)[:80]!r}")
    return names


def rendered(query: sql.Composable) -> str:
    """The statement's text, for a statement executed often: composed once, rendered once. Rendered
    without a connection: identifiers are quoted by psycopg's rules (an ASCII name as `"name"`)."""
    return query.as_string(None)
