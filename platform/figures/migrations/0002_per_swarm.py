"""Each node's totals and hours per swarm. The folded tables are emptied and the cursor forgotten, so the next
fold (a page's, the scheduled job's, or `manage.py sapo_stats fold`) counts the whole pool again into
every table at once: the per-swarm rows and the totals come from the same rows (as `sapo_stats rebuild`)."""

import django.db.models.deletion
from django.db import migrations, models

_FORGET = (
    "DELETE FROM web_nodestats; DELETE FROM web_nodehour; DELETE FROM web_datasethour; DELETE FROM web_statscursor;"
)


class Migration(migrations.Migration):
    dependencies = [
        ("figures", "0001_initial"),
        ("nodes", "0001_initial"),
        ("swarms", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="NodeSwarmStats",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("accepted_groups", models.PositiveIntegerField(default=0)),
                ("rejected_groups", models.PositiveIntegerField(default=0)),
                ("moderated_groups", models.PositiveIntegerField(default=0)),
                ("credited_completions", models.PositiveIntegerField(default=0)),
                ("verified_reward", models.FloatField(default=0.0)),
                ("credit_growth", models.FloatField(default=0.0)),
                ("helped", models.PositiveIntegerField(default=0)),
                ("rounds", models.PositiveIntegerField(default=0)),
                (
                    "node",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="nodes.node",
                    ),
                ),
                (
                    "swarm",
                    models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="swarms.swarm"),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("node", "swarm"), name="figures_nodeswarmstats_unique")
                ],
            },
        ),
        migrations.CreateModel(
            name="NodeSwarmHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField()),
                ("accepted_groups", models.PositiveIntegerField(default=0)),
                ("rejected_groups", models.PositiveIntegerField(default=0)),
                ("credited_completions", models.PositiveIntegerField(default=0)),
                ("verified_reward", models.FloatField(default=0.0)),
                (
                    "node",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="nodes.node",
                    ),
                ),
                (
                    "swarm",
                    models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="swarms.swarm"),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("node", "swarm", "hour"), name="figures_nodeswarmhour_unique")
                ],
            },
        ),
        migrations.RunSQL(_FORGET, migrations.RunSQL.noop),
    ]
