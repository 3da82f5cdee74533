"""The pool's per-node record keeps counts only: `trust` is the moderation app's (one trust)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0001_initial"),
        ("pool", "0001_initial"),
    ]

    operations = [
        migrations.RenameModel(old_name="NodeTrust", new_name="NodeVerdictCounts"),
        migrations.RemoveField(model_name="nodeverdictcounts", name="trust"),
        migrations.AlterField(
            model_name="nodeverdictcounts",
            name="node",
            field=models.OneToOneField(
                on_delete=django.db.models.deletion.CASCADE,
                primary_key=True,
                related_name="verdict_counts",
                serialize=False,
                to="nodes.node",
            ),
        ),
        migrations.AlterModelOptions(
            name="nodeverdictcounts",
            options={"verbose_name_plural": "node verdict counts"},
        ),
    ]
