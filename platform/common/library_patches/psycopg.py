"""psycopg: statements up to a longer length keep their converted placeholders in psycopg's cache.

psycopg converts a statement's %(name)s placeholders once per text and caches the result, but only for
texts of at most `psycopg._queries.MAX_CACHED_STATEMENT_LENGTH` bytes (4,096; a guard against ORMs'
ever-different statements); a longer one is parsed again, with a regular expression, at every
execution. `cache_statements_up_to` raises that module global, which `PostgresQuery.convert` reads at
call time (common.db says which statements need it and why).
"""

from __future__ import annotations

from common.library_patches._inspect import names_used


def cache_statements_up_to(max_bytes: int) -> None:
    """psycopg caches the conversion of statements of up to `max_bytes` bytes (never lowers its own limit)."""
    from psycopg import _queries

    _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, max_bytes)


def moved() -> list[str]:
    """What `cache_statements_up_to` relies on that this psycopg no longer has where it expects."""
    from psycopg import _queries

    if not isinstance(getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", None), int):
        return ["psycopg._queries no longer keeps its cache limit as MAX_CACHED_STATEMENT_LENGTH"]
    for query in (_queries.PostgresQuery, _queries.PostgresClientQuery):
        if "MAX_CACHED_STATEMENT_LENGTH" not in names_used(query.convert):
            return [f"psycopg._queries.{query.__name__}.convert no longer reads MAX_CACHED_STATEMENT_LENGTH"]
    if not hasattr(getattr(_queries, "_query2pg", None), "cache_info"):
        return ["psycopg._queries no longer caches converted statements in _query2pg"]
    return []
