"""The swarm pages' figures per swarm: the folded hours of each dataset gain their swarm. Rows folded
before are the default swarm's (every group was, pool 0007); the column is added with it as a default,
which PostgreSQL keeps in the catalogue instead of rewriting the table."""

import importlib

import django.db.models.deletion
from django.db import migrations, models
from psycopg import sql


def add_swarm(apps, schema_editor) -> None:
    default = importlib.import_module("pool.migrations.0007_swarms").default_swarm(apps, schema_editor)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            sql.SQL("ALTER TABLE web_datasethour ADD COLUMN swarm_id bigint NOT NULL DEFAULT {}").format(
                sql.Literal(default.id)
            )
        )
        cursor.execute("ALTER TABLE web_datasethour ALTER COLUMN swarm_id DROP DEFAULT")
        cursor.execute(
            "ALTER TABLE web_datasethour ADD CONSTRAINT web_datasethour_swarm_fk FOREIGN KEY (swarm_id)"
            " REFERENCES swarms_swarm (id) DEFERRABLE INITIALLY DEFERRED"
        )


def remove_swarm(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("ALTER TABLE web_datasethour DROP COLUMN swarm_id")


class Migration(migrations.Migration):
    dependencies = [
        ("web", "0001_initial"),
        ("pool", "0007_swarms"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="datasethour", name="web_datasethour_unique"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="datasethour",
                    name="swarm",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="swarms.swarm",
                    ),
                    preserve_default=False,
                ),
            ],
            database_operations=[migrations.RunPython(add_swarm, remove_swarm)],
        ),
        migrations.AddConstraint(
            model_name="datasethour",
            constraint=models.UniqueConstraint(
                fields=("swarm", "hour", "dataset"), name="web_datasethour_swarm_unique"
            ),
        ),
    ]
