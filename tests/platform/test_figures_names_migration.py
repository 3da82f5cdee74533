"""Migration figures 0004: the figures tables' keys, constraints, indexes and id sequences carry the
app's name (as Django names them on a table of this app), and going back gives them their old names."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

TABLES = ["figures_datasethour", "figures_nodehour", "figures_nodestats", "figures_statscursor"]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _names() -> set[str]:
    """Every constraint, index and sequence of the figures tables."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT conname FROM pg_constraint WHERE conrelid = ANY(%(tables)s::regclass[])
            UNION SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = ANY(%(tables)s::regclass[])
            UNION SELECT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid
                WHERE s.relkind = 'S' AND d.refobjid = ANY(%(tables)s::regclass[])
            """,
            {"tables": TABLES},
        )
        return {name for (name,) in cursor.fetchall()}


def test_the_figures_tables_names_say_figures_and_go_back():
    after = _names()
    assert after, "the figures tables have constraints, indexes and sequences"
    assert not {n for n in after if n.startswith("web_")}
    with connection.schema_editor() as editor:
        fk_index = editor._create_index_name("figures_nodehour", ["node_id"], suffix="")
    assert {"figures_nodehour_unique", "figures_datasethour_swarm_unique", fk_index} <= after
    assert {"figures_nodehour_id_seq", "figures_datasethour_id_seq", "figures_statscursor_id_seq"} <= after

    _migrate([("figures", "0003_tables_named_for_figures")])
    try:
        before = _names()
        assert {"web_nodehour_unique", "web_datasethour_swarm_unique", "web_nodehour_node_id_98ae19de"} <= before
        assert not {n for n in before if n.startswith("figures_")}
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    assert _names() == after
