"""pool_rollout had two indexes led by node_id: the ForeignKey's own and pool_rollout_node_idx
(node_id, created_at DESC), which serves every lookup by node. The first is dropped: one index entry
less per stored group. Django's schema editor sees no change to make for `db_index=False` here (the
field's index is not dropped by AlterField), so the SQL is explicit."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0002_presence"),
        ("pool", "0005_completions_lz4"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="rollout",
                    name="node",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="rollouts",
                        to="nodes.node",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX IF EXISTS pool_rollout_node_id_919a2c7a",
                    reverse_sql="CREATE INDEX IF NOT EXISTS pool_rollout_node_id_919a2c7a ON pool_rollout (node_id)",
                ),
            ],
        ),
    ]
