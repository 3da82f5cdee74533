"""Every group, round and consumption belongs to a swarm: today's join the default swarm (swarms 0002).

The columns are added with the default swarm as their default and the default then dropped: PostgreSQL
stores such a default once in the catalogue instead of rewriting the table, so a filled pool gains its
swarm in constant time, no group moved or lost, with no batches to run (the foreign keys are then
checked by one scan each, VALIDATE CONSTRAINT, which blocks no writer). The pool's one sample
sequence becomes the default swarm's (its numbers go on where they were); each swarm made later gets
its own (swarms.services.swarm_create). The sampling indexes lead with the swarm.
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models
from psycopg import sql

# (table, constraint, index or None): each table that grows with groups and feeds figures.
_TABLES = (
    ("pool_rollout", "pool_rollout_swarm_fk", None),
    ("pool_noderound", "pool_noderound_swarm_fk", "pool_noderound_swarm_id_idx"),
    ("pool_consumption", "pool_consumption_swarm_fk", "pool_consumption_swarm_id_idx"),
)


def _execute(schema_editor, statement) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(statement)


def default_swarm(apps, schema_editor):
    """The default swarm swarms 0002 made (made again if the table was emptied since)."""
    Swarm = apps.get_model("swarms", "Swarm")
    if not Swarm.objects.filter(is_default=True).exists():
        importlib.import_module("swarms.migrations.0002_default_swarm").default_swarm(apps, schema_editor)
    return Swarm.objects.get(is_default=True)


def _exists(schema_editor, name: str) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return cursor.fetchone()[0]


def add_swarm_columns(apps, schema_editor) -> None:
    default = default_swarm(apps, schema_editor)
    sequence = sql.Identifier(f"swarms_sample_seq_{default.id}")
    if _exists(schema_editor, "pool_rollout_sample_seq"):
        _execute(schema_editor, sql.SQL("ALTER SEQUENCE pool_rollout_sample_seq RENAME TO {}").format(sequence))
    else:
        _execute(schema_editor, sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(sequence))
    for table, constraint, index in _TABLES:
        table_id = sql.Identifier(table)
        _execute(
            schema_editor,
            sql.SQL("ALTER TABLE {} ADD COLUMN swarm_id bigint NOT NULL DEFAULT {}").format(
                table_id, sql.Literal(default.id)
            ),
        )
        _execute(schema_editor, sql.SQL("ALTER TABLE {} ALTER COLUMN swarm_id DROP DEFAULT").format(table_id))
        _execute(
            schema_editor,
            sql.SQL(
                "ALTER TABLE {} ADD CONSTRAINT {} FOREIGN KEY (swarm_id) REFERENCES swarms_swarm (id) "
                "DEFERRABLE INITIALLY DEFERRED NOT VALID"
            ).format(table_id, sql.Identifier(constraint)),
        )
        _execute(
            schema_editor, sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(table_id, sql.Identifier(constraint))
        )
        if index is not None:
            _execute(schema_editor, sql.SQL("CREATE INDEX {} ON {} (swarm_id)").format(sql.Identifier(index), table_id))
    # Every group stored so far was verified against the catalogue the default swarm was made from.
    _execute(schema_editor, sql.SQL("ALTER TABLE pool_rollout ADD COLUMN catalogue_version integer NOT NULL DEFAULT 1"))
    _execute(schema_editor, sql.SQL("ALTER TABLE pool_rollout ALTER COLUMN catalogue_version DROP DEFAULT"))
    _execute(
        schema_editor,
        sql.SQL(
            "ALTER TABLE pool_rollout ADD CONSTRAINT pool_rollout_catalogue_version_check CHECK (catalogue_version >= 0)"
        ),
    )


def remove_swarm_columns(apps, schema_editor) -> None:
    """Back to one pool: the columns go (their constraints and indexes with them), and the default
    swarm's sequence becomes the pool's again."""
    Swarm = apps.get_model("swarms", "Swarm")
    for table, _, _ in _TABLES:
        _execute(schema_editor, sql.SQL("ALTER TABLE {} DROP COLUMN swarm_id").format(sql.Identifier(table)))
    _execute(schema_editor, sql.SQL("ALTER TABLE pool_rollout DROP COLUMN catalogue_version"))
    default = Swarm.objects.filter(is_default=True).first()
    sequence = f"swarms_sample_seq_{default.id}" if default is not None else None
    if sequence is not None and _exists(schema_editor, sequence):
        _execute(
            schema_editor,
            sql.SQL("ALTER SEQUENCE {} RENAME TO pool_rollout_sample_seq").format(sql.Identifier(sequence)),
        )
    else:
        _execute(schema_editor, sql.SQL("CREATE SEQUENCE IF NOT EXISTS pool_rollout_sample_seq"))


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0006_rollout_node_one_index"),
        ("swarms", "0002_default_swarm"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="rollout",
                    name="swarm",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="swarms.swarm",
                    ),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="rollout",
                    name="catalogue_version",
                    field=models.PositiveIntegerField(help_text="The swarm's catalogue version it was verified under."),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="noderound",
                    name="swarm",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="swarms.swarm"
                    ),
                    preserve_default=False,
                ),
                migrations.AddField(
                    model_name="consumption",
                    name="swarm",
                    field=models.ForeignKey(
                        help_text="rollout.swarm.",
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="swarms.swarm",
                    ),
                    preserve_default=False,
                ),
            ],
            database_operations=[migrations.RunPython(add_swarm_columns, remove_swarm_columns)],
        ),
        migrations.RemoveIndex(model_name="rollout", name="pool_rollout_sample_seq_idx"),
        migrations.RemoveIndex(model_name="rollout", name="pool_rollout_fresh_idx"),
        migrations.AddIndex(
            model_name="rollout",
            index=models.Index(
                condition=models.Q(("sampleable", True)),
                fields=["swarm", "sample_seq"],
                name="pool_rollout_swarm_seq_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="rollout",
            index=models.Index(
                condition=models.Q(("sampleable", True)),
                fields=["swarm", "created_at"],
                name="pool_rollout_swarm_fresh_idx",
            ),
        ),
        migrations.AlterField(
            model_name="rollout",
            name="sample_seq",
            field=models.BigIntegerField(
                blank=True,
                help_text="Dense number in its swarm (the swarm's own sequence), given when it first becomes sampleable.",
                null=True,
            ),
        ),
    ]
