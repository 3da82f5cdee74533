"""The figures tables' keys, constraints, indexes and id sequences take the names Django gives them
on tables of this app (figures_nodehour_pkey, figures_nodehour_unique, figures_nodehour_id_seq, ...):
a rename in place, nothing rebuilt. Reversible."""

from django.db import migrations, models
from psycopg import sql

#: The columns PostgreSQL checks (>= 0) on each table; their checks are named <table>_<column>_check.
_CHECKED = {
    "datasethour": ("accepted_groups", "rejected_groups", "credited_completions"),
    "nodehour": ("accepted_groups", "rejected_groups", "credited_completions"),
    "nodestats": ("accepted_groups", "rejected_groups", "moderated_groups", "credited_completions", "helped", "rounds"),
}

#: (table, old name, new name) of each constraint; a key's or a unique constraint's index follows it.
_CONSTRAINTS = [
    *(
        (f"figures_{m}", f"web_{m}_pkey", f"figures_{m}_pkey")
        for m in ("datasethour", "nodehour", "nodestats", "statscursor")
    ),
    *(
        (f"figures_{m}", f"web_{m}_{c}_check", f"figures_{m}_{c}_check")
        for m, columns in _CHECKED.items()
        for c in columns
    ),
    ("figures_nodehour", "web_nodehour_unique", "figures_nodehour_unique"),
    ("figures_datasethour", "web_datasethour_swarm_unique", "figures_datasethour_swarm_unique"),
    ("figures_datasethour", "web_datasethour_swarm_fk", "figures_datasethour_swarm_id_b7c9ae77_fk_swarms_swarm_id"),
    (
        "figures_nodehour",
        "web_nodehour_node_id_98ae19de_fk_nodes_node_id",
        "figures_nodehour_node_id_9f82eb5a_fk_nodes_node_id",
    ),
    (
        "figures_nodestats",
        "web_nodestats_node_id_c672a4b3_fk_nodes_node_id",
        "figures_nodestats_node_id_2b343ed0_fk_nodes_node_id",
    ),
]

#: (old name, new name) of each index that backs no constraint (the node's foreign key on the hours).
_INDEXES = [("web_nodehour_node_id_98ae19de", "figures_nodehour_node_id_9f82eb5a")]

#: (old name, new name) of each id sequence (the node totals' key is the node's).
_SEQUENCES = [(f"web_{m}_id_seq", f"figures_{m}_id_seq") for m in ("datasethour", "nodehour", "statscursor")]


def _rename(schema_editor, *, forward: bool) -> None:
    def pair(old: str, new: str) -> tuple[sql.Identifier, sql.Identifier]:
        return (sql.Identifier(old), sql.Identifier(new)) if forward else (sql.Identifier(new), sql.Identifier(old))

    statements = [
        sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(sql.Identifier(table), *pair(old, new))
        for table, old, new in _CONSTRAINTS
    ]
    statements += [sql.SQL("ALTER INDEX {} RENAME TO {}").format(*pair(old, new)) for old, new in _INDEXES]
    statements += [sql.SQL("ALTER SEQUENCE {} RENAME TO {}").format(*pair(old, new)) for old, new in _SEQUENCES]
    with schema_editor.connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)


def forwards(apps, schema_editor) -> None:
    _rename(schema_editor, forward=True)


def backwards(apps, schema_editor) -> None:
    _rename(schema_editor, forward=False)


class Migration(migrations.Migration):
    dependencies = [
        ("figures", "0003_tables_named_for_figures"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[
                migrations.RemoveConstraint(model_name="nodehour", name="web_nodehour_unique"),
                migrations.AddConstraint(
                    model_name="nodehour",
                    constraint=models.UniqueConstraint(fields=("node", "hour"), name="figures_nodehour_unique"),
                ),
                migrations.RemoveConstraint(model_name="datasethour", name="web_datasethour_swarm_unique"),
                migrations.AddConstraint(
                    model_name="datasethour",
                    constraint=models.UniqueConstraint(
                        fields=("swarm", "hour", "dataset"), name="figures_datasethour_swarm_unique"
                    ),
                ),
            ],
        ),
    ]
