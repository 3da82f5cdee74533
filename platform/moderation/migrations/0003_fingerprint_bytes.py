"""RolloutFingerprint.exact and .simhash from JSON lists to bytes (the fingerprints concatenated: 16-byte
digests, 8-byte big-endian simhashes), converted in place. A row whose lists are not what the rules
wrote (32 hex characters per digest, one integer per simhash, as many of each) is dropped: fingerprints
are a cache of the last days' groups for the duplicate rules, rebuilt as groups arrive."""

from django.db import migrations, models

FORWARD = """
DELETE FROM moderation_rolloutfingerprint f
WHERE jsonb_typeof(f.exact) <> 'array' OR jsonb_typeof(f.simhash) <> 'array'
   OR jsonb_array_length(f.exact) <> jsonb_array_length(f.simhash)
   OR EXISTS (SELECT 1 FROM jsonb_array_elements(f.exact) AS e(x)
              WHERE jsonb_typeof(e.x) <> 'string' OR e.x #>> '{}' !~ '^[0-9a-f]{32}$')
   OR EXISTS (SELECT 1 FROM jsonb_array_elements(f.simhash) AS e(x)
              WHERE jsonb_typeof(e.x) <> 'number' OR e.x #>> '{}' !~ '^-?[0-9]{1,19}$'
                 OR (e.x #>> '{}')::numeric NOT BETWEEN -9223372036854775808 AND 9223372036854775807);
ALTER TABLE moderation_rolloutfingerprint ADD COLUMN exact_bytes bytea, ADD COLUMN simhash_bytes bytea;
UPDATE moderation_rolloutfingerprint f SET
    exact_bytes = coalesce((SELECT string_agg(decode(e.x, 'hex'), ''::bytea ORDER BY e.n)
                            FROM jsonb_array_elements_text(f.exact) WITH ORDINALITY AS e(x, n)), ''::bytea),
    simhash_bytes = coalesce((SELECT string_agg(int8send(e.x::bigint), ''::bytea ORDER BY e.n)
                              FROM jsonb_array_elements_text(f.simhash) WITH ORDINALITY AS e(x, n)), ''::bytea);
ALTER TABLE moderation_rolloutfingerprint DROP COLUMN exact, DROP COLUMN simhash;
ALTER TABLE moderation_rolloutfingerprint RENAME COLUMN exact_bytes TO exact;
ALTER TABLE moderation_rolloutfingerprint RENAME COLUMN simhash_bytes TO simhash;
ALTER TABLE moderation_rolloutfingerprint ALTER COLUMN exact SET NOT NULL, ALTER COLUMN simhash SET NOT NULL;
"""

BACKWARD = """
ALTER TABLE moderation_rolloutfingerprint ADD COLUMN exact_json jsonb, ADD COLUMN simhash_json jsonb;
UPDATE moderation_rolloutfingerprint f SET
    exact_json = coalesce((SELECT jsonb_agg(encode(substr(f.exact, 16 * i + 1, 16), 'hex') ORDER BY i)
                           FROM generate_series(0, length(f.exact) / 16 - 1) AS i), '[]'::jsonb),
    simhash_json = coalesce((SELECT jsonb_agg(('x' || encode(substr(f.simhash, 8 * i + 1, 8), 'hex'))::bit(64)::bigint
                                              ORDER BY i)
                             FROM generate_series(0, length(f.simhash) / 8 - 1) AS i), '[]'::jsonb);
ALTER TABLE moderation_rolloutfingerprint DROP COLUMN exact, DROP COLUMN simhash;
ALTER TABLE moderation_rolloutfingerprint RENAME COLUMN exact_json TO exact;
ALTER TABLE moderation_rolloutfingerprint RENAME COLUMN simhash_json TO simhash;
ALTER TABLE moderation_rolloutfingerprint ALTER COLUMN exact SET NOT NULL, ALTER COLUMN simhash SET NOT NULL;
"""


class Migration(migrations.Migration):
    dependencies = [("moderation", "0002_fingerprint_no_db_constraints")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, BACKWARD)],
            state_operations=[
                migrations.AlterField(
                    model_name="rolloutfingerprint", name="exact", field=models.BinaryField(default=bytes)
                ),
                migrations.AlterField(
                    model_name="rolloutfingerprint", name="simhash", field=models.BinaryField(default=bytes)
                ),
            ],
        )
    ]
