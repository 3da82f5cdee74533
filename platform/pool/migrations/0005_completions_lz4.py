"""A group's completions (its one large column: ~2.3 KB of JSON for 8 completions of 300 characters)
are compressed with lz4 rather than PostgreSQL's default pglz: the same values, stored and read back
byte for byte, for less of the database's CPU (docs/benchmarks.md, "How ingest is made fast"). Rows
stored before keep pglz (PostgreSQL reads either). A server
built without lz4 keeps pglz.
"""

from django.db import migrations

_HAS_LZ4 = "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"


def _set_compression(method: str):
    def run(apps, schema_editor) -> None:  # noqa: ANN001
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(_HAS_LZ4)
            row = cursor.fetchone()
            if row and row[0]:
                cursor.execute(f"ALTER TABLE pool_rollout ALTER COLUMN completions SET COMPRESSION {method}")

    return run


class Migration(migrations.Migration):
    dependencies = [("pool", "0004_served_and_storage")]

    operations = [migrations.RunPython(_set_compression("lz4"), _set_compression("pglz"))]
