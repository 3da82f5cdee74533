"""The groups under review by time (partial: held and quarantined only), for the texts retention."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0002_presence"),
        ("pool", "0009_retention_days"),
        ("swarms", "0002_default_swarm"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="rollout",
            index=models.Index(
                condition=models.Q(("moderation_status__in", ["held", "quarantined"])),
                fields=["created_at"],
                name="pool_rollout_review_idx",
            ),
        ),
    ]
