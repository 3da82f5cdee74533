"""Migration pool 0007: a filled pool of one site joins the default swarm (swarms 0002) whole: every
group, round and consumption keeps its row and gets the default swarm, groups keep their sample
numbers, and the default swarm's sequence goes on after them."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from factories import make_node
from psycopg import sql

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("pool", "0006_rollout_node_one_index")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    """Every app's newest migration: going back also unapplied other apps' migrations that depend on the
    one gone back to (such as figures' table names), and the tests after this one need them all."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def test_a_filled_pool_joins_the_default_swarm_without_losing_a_group():
    author, consumer = make_node(), make_node()
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO pool_rollout (id, node_id, round, dataset, seed, index, question, answer, completions,
                    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
                    has_variance, sampleable, sample_seq, created_at)
                SELECT gen_random_uuid(), %(node)s, 1, 'basic_arithmetic', 1, g, 'q', 'a', '["x", "y"]', 2,
                       '[1, 0]', '[1, 0]', 'accepted', '', 'ok', g %% 3 <> 0, g %% 3 <> 0,
                       CASE WHEN g %% 3 <> 0 THEN nextval('pool_rollout_sample_seq') END, now()
                FROM generate_series(1, 3000) AS g
                """,
                {"node": author.id},
            )
            cursor.execute(
                "INSERT INTO pool_noderound (node_id, round, figures, used_count, created_at, updated_at)"
                " VALUES (%s, 1, '{}', 1, now(), now())",
                [consumer.id],
            )
            cursor.execute(
                "INSERT INTO pool_consumption (consumer_id, rollout_id, author_id, round, created_at)"
                " SELECT %s, id, node_id, 1, now() FROM pool_rollout WHERE sampleable LIMIT 5",
                [consumer.id],
            )
            cursor.execute("SELECT id, sample_seq FROM pool_rollout")
            before = dict(cursor.fetchall())
        _migrate(_latest())
        from swarms.models import Swarm

        default = Swarm.objects.get(is_default=True)
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, sample_seq FROM pool_rollout")
            assert dict(cursor.fetchall()) == before
            for table in ("pool_rollout", "pool_noderound", "pool_consumption"):
                cursor.execute(sql.SQL("SELECT DISTINCT swarm_id FROM {}").format(sql.Identifier(table)))
                assert cursor.fetchall() == [(default.id,)], table
            cursor.execute("SELECT DISTINCT catalogue_version FROM pool_rollout")
            assert cursor.fetchall() == [(1,)]
            cursor.execute("SELECT nextval(%s::regclass)", [default.sample_sequence])
            assert cursor.fetchone()[0] == max(v for v in before.values() if v is not None) + 1
    finally:
        _migrate(_latest())
