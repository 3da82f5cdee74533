"""The pool's table as migrated: what every stored group costs in index entries."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_one_index_leads_with_the_node_of_a_group():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pool_rollout'")
        indexes = dict(cursor.fetchall())
    led_by_node = {name: definition for name, definition in indexes.items() if "(node_id" in definition}
    # (node_id, created_at DESC) serves lookups by node; the other is partial, for the groups that answered
    # a challenge's question (pool.challenges: a node answers each question of a challenge once).
    assert sorted(led_by_node) == ["pool_rollout_node_idx", "pool_rollout_question_idx"], indexes
    assert (
        "(node_id, seed, index) WHERE (NOT ((audit_state)::text = 'unaudited'::text))"
        in led_by_node["pool_rollout_question_idx"]
    )


@pytest.mark.parametrize("prepare", [True, False])
def test_a_shares_statements_are_prepared_once_per_connection_unless_turned_off(settings, prepare):
    from factories import make_node
    from support.moderation import group, share

    settings.SAPO_DB_PREPARE = prepare
    node = make_node()

    def prepared() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements WHERE statement LIKE '%%unnest%%'")
            return [row[0] for row in cursor.fetchall()]

    before = len(prepared())
    share(node, group(1), group(2))
    after_one = prepared()
    share(node, group(3))  # the same statements again: prepared already, not again
    assert len(prepared()) == len(after_one)
    if prepare:
        texts = " ".join(after_one)
        assert len(after_one) - before == 2  # the screening's read, the pool's INSERT with the rules' record
        assert "INSERT INTO pool_rollout" in texts and "moderation_rolloutfingerprint" in texts
    else:
        assert len(after_one) == before == 0


@pytest.mark.django_db(transaction=True)  # as served: the screening's read runs outside a transaction
def test_a_shares_statements_are_planned_once_per_connection_whatever_its_size():
    # PostgreSQL plans a prepared statement afresh at each execution while that "custom" plan looks
    # cheaper than the generic one: for the screening's read of one or two questions, every time
    # (more of its CPU than executing it: docs/benchmarks.md, "How ingest is made fast"). common.db
    # asks for the generic plan.
    from factories import make_node
    from support.moderation import group, share

    node = make_node()
    for i in range(8):  # one-group shares, each on its own question
        share(node, group(10 + i))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%%unnest%%'"
        )
        plans = {" ".join(row[0].split())[:40]: row[1:] for row in cursor.fetchall()}
    assert len(plans) == 2, plans  # the screening's read, the pool's INSERT with the rules' record
    assert all(custom == 0 and generic == 8 for generic, custom in plans.values()), plans


def test_a_shares_statements_are_short_enough_for_psycopgs_query_cache():
    """psycopg converts a statement's %(name)s placeholders once and caches the result only for texts
    of at most MAX_CACHED_STATEMENT_LENGTH bytes; a longer one is parsed with a regular expression at
    every execution (docs/benchmarks.md, "How ingest is made fast"). common.db raises the limit
    for the share's fixed statements: they fit under it, and psycopg does cache them."""
    from psycopg import _queries

    from common.db import STATEMENT_CACHE_BYTES, server_binding_cursor
    from moderation.screening import _SCREENING_READS_SQL, RECORD_SQL
    from pool.ingest_statement import insert_statement
    from pool.seams import RecordPart

    assert _queries.MAX_CACHED_STATEMENT_LENGTH == STATEMENT_CACHE_BYTES  # psycopg still reads this name
    statements = (insert_statement(RecordPart(RECORD_SQL, {})), insert_statement(None), _SCREENING_READS_SQL)
    for sql in statements:
        assert len(sql.encode()) <= STATEMENT_CACHE_BYTES, sql[:80]
    longer = "SELECT %(a)s::int /* " + "x" * 5000 + " */"  # past psycopg's own limit, within ours
    with server_binding_cursor() as cursor:  # converted once: the second execution is a cache hit
        cursor.execute(longer, {"a": 1})
        hits = _queries._query2pg.cache_info().hits
        cursor.execute(longer, {"a": 2})
        assert cursor.fetchone() == (2,)
    assert _queries._query2pg.cache_info().hits == hits + 1
