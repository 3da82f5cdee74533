"""A group's texts move from its ledger row (pool_rollout) to pool_rollouttext, range-partitioned by
`created_at`, one partition per UTC day and a DEFAULT one (docs/architecture.md, "The pool's storage").

Django does not make partitioned tables: the SQL is written here, and the model's state declared beside
it. A filled pool moves in whole: the day partitions are made from its oldest group's day to 7 days
ahead, every group's texts are copied by one INSERT ... SELECT (the time it takes per million groups is
in docs/deploy.md, "Text retention and archives"), then the ledger's text columns are dropped (a
catalogue change: PostgreSQL does not rewrite the table; VACUUM FULL or pg_repack gives the space back).
Backward, the columns come back filled from the texts (a group whose texts aged out gets an empty
question and no completions).
"""

import datetime

import django.db.models.deletion
from django.db import migrations, models

_HAS_LZ4 = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"

_CREATE = """
CREATE TABLE pool_rollouttext (
    rollout_id uuid NOT NULL,
    swarm_id bigint NOT NULL,
    created_at timestamptz NOT NULL,
    question text NOT NULL,
    answer text NULL,
    completions jsonb NOT NULL,
    PRIMARY KEY (rollout_id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE pool_rollouttext_default PARTITION OF pool_rollouttext DEFAULT;
"""

# Day partitions from the oldest group's day to 7 days ahead (pool.retention makes them ahead from
# then on, with the same names and bounds).
_DAYS = """
SELECT d::date FROM generate_series(
    coalesce((SELECT min(created_at) FROM pool_rollout), now()) AT TIME ZONE 'UTC',
    (now() AT TIME ZONE 'UTC') + interval '7 days', interval '1 day') AS d
"""

_MOVE_IN = """
INSERT INTO pool_rollouttext (rollout_id, swarm_id, created_at, question, answer, completions)
SELECT id, swarm_id, created_at, question, answer, completions FROM pool_rollout;
ALTER TABLE pool_rollout DROP COLUMN question, DROP COLUMN answer, DROP COLUMN completions;
"""

_MOVE_OUT = """
ALTER TABLE pool_rollout ADD COLUMN question text NULL, ADD COLUMN answer text NULL, ADD COLUMN completions jsonb NULL;
UPDATE pool_rollout r SET question = t.question, answer = t.answer, completions = t.completions
FROM pool_rollouttext t WHERE t.rollout_id = r.id AND t.created_at = r.created_at;
UPDATE pool_rollout SET question = '', completions = '[]' WHERE completions IS NULL;
ALTER TABLE pool_rollout ALTER COLUMN question SET NOT NULL, ALTER COLUMN completions SET NOT NULL;
DROP TABLE pool_rollouttext;
"""


def move_in(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_CREATE)
        cursor.execute(_HAS_LZ4)
        row = cursor.fetchone()
        if row and row[0]:
            cursor.execute("ALTER TABLE pool_rollouttext ALTER COLUMN completions SET COMPRESSION lz4")
            cursor.execute("ALTER TABLE pool_rollouttext_default ALTER COLUMN completions SET COMPRESSION lz4")
        cursor.execute(_DAYS)
        for (day,) in cursor.fetchall():
            name = f"pool_rollouttext_p{day:%Y%m%d}"
            cursor.execute(
                f"CREATE TABLE {name} PARTITION OF pool_rollouttext"
                f" FOR VALUES FROM ('{day:%Y-%m-%d} 00:00+00') TO ('{day + datetime.timedelta(days=1):%Y-%m-%d} 00:00+00')"
            )
            if row and row[0]:
                cursor.execute(f"ALTER TABLE {name} ALTER COLUMN completions SET COMPRESSION lz4")
        cursor.execute(_MOVE_IN)


def move_out(apps, schema_editor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(_MOVE_OUT)


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0007_swarms"),
        ("swarms", "0002_default_swarm"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(move_in, move_out)],
            state_operations=[
                migrations.RemoveField(model_name="rollout", name="answer"),
                migrations.RemoveField(model_name="rollout", name="completions"),
                migrations.RemoveField(model_name="rollout", name="question"),
                migrations.CreateModel(
                    name="RolloutText",
                    fields=[
                        (
                            "pk",
                            models.CompositePrimaryKey(
                                "rollout", "created_at", blank=True, editable=False, primary_key=True, serialize=False
                            ),
                        ),
                        ("created_at", models.DateTimeField()),
                        ("question", models.TextField()),
                        (
                            "answer",
                            models.TextField(
                                blank=True, help_text="Null for tasks without a single answer.", null=True
                            ),
                        ),
                        ("completions", models.JSONField(help_text="List of completion texts, as sent.")),
                        (
                            "rollout",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="text_rows",
                                to="pool.rollout",
                            ),
                        ),
                        (
                            "swarm",
                            models.ForeignKey(
                                db_constraint=False,
                                db_index=False,
                                on_delete=django.db.models.deletion.DO_NOTHING,
                                related_name="+",
                                to="swarms.swarm",
                            ),
                        ),
                    ],
                ),
            ],
        )
    ]
