"""The folded figures' models move from web to figures. Their tables keep their names (db_table), so
this changes Django's state only: no table is created, renamed or copied (web 0003 drops them from
web's state)."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("nodes", "0001_initial"),
        ("swarms", "0001_initial"),
        ("web", "0002_datasethour_swarm"),
    ]

    state_operations = [
        migrations.CreateModel(
            name="StatsCursor",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("folded_until", models.DateTimeField(help_text="Groups created before this are in the totals.")),
                (
                    "consumption_id",
                    models.BigIntegerField(default=0, help_text="Consumption rows with id <= this are counted."),
                ),
                (
                    "round_id",
                    models.BigIntegerField(default=0, help_text="NodeRound rows with id <= this are counted."),
                ),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={"db_table": "web_statscursor"},
        ),
        migrations.CreateModel(
            name="NodeStats",
            fields=[
                (
                    "node",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="stats",
                        serialize=False,
                        to="nodes.node",
                    ),
                ),
                ("accepted_groups", models.PositiveIntegerField(default=0)),
                ("rejected_groups", models.PositiveIntegerField(default=0)),
                (
                    "moderated_groups",
                    models.PositiveIntegerField(default=0, help_text="Accepted, then taken out by moderation."),
                ),
                ("credited_completions", models.PositiveIntegerField(default=0)),
                (
                    "verified_reward",
                    models.FloatField(default=0.0, help_text="Sum of verified rewards of credited groups."),
                ),
                (
                    "credit_growth",
                    models.FloatField(
                        default=0.0,
                        help_text="Sum of each credited reward times its decay weight (figures.credit.growth_of).",
                    ),
                ),
                (
                    "helped",
                    models.PositiveIntegerField(
                        default=0, help_text="(other node, group) pairs that trained on its groups."
                    ),
                ),
                ("rounds", models.PositiveIntegerField(default=0, help_text="Round reports received (self-reported).")),
            ],
            options={"db_table": "web_nodestats"},
        ),
        migrations.CreateModel(
            name="NodeHour",
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
                        on_delete=django.db.models.deletion.CASCADE, related_name="hours", to="nodes.node"
                    ),
                ),
            ],
            options={
                "db_table": "web_nodehour",
                "constraints": [models.UniqueConstraint(fields=("node", "hour"), name="web_nodehour_unique")],
            },
        ),
        migrations.CreateModel(
            name="DatasetHour",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("hour", models.DateTimeField()),
                ("dataset", models.CharField(max_length=64)),
                ("accepted_groups", models.PositiveIntegerField(default=0)),
                ("rejected_groups", models.PositiveIntegerField(default=0)),
                ("credited_completions", models.PositiveIntegerField(default=0)),
                ("verified_reward", models.FloatField(default=0.0)),
                (
                    "swarm",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="swarms.swarm",
                    ),
                ),
            ],
            options={
                "db_table": "web_datasethour",
                "constraints": [
                    models.UniqueConstraint(fields=("swarm", "hour", "dataset"), name="web_datasethour_swarm_unique")
                ],
            },
        ),
    ]

    operations = [migrations.SeparateDatabaseAndState(state_operations=state_operations)]
