import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Swarm",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "slug",
                    models.CharField(
                        max_length=40,
                        unique=True,
                        validators=[
                            django.core.validators.RegexValidator(
                                "^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$",
                                "A swarm's slug is 1-40 lowercase letters, digits and hyphens, starting and ending with a letter or digit.",
                            )
                        ],
                    ),
                ),
                ("title", models.CharField(max_length=80)),
                ("description", models.TextField(blank=True, max_length=1000)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("open", "Open"),
                            ("paused", "Paused (nodes train in silo, nothing is shared)"),
                            ("retired", "Retired (read-only archive)"),
                        ],
                        default="open",
                        max_length=16,
                    ),
                ),
                (
                    "recommended_models",
                    models.JSONField(blank=True, default=list, help_text="Model names; empty means any."),
                ),
                (
                    "default_local",
                    models.PositiveSmallIntegerField(default=4, help_text="I: groups of its own a node trains on."),
                ),
                (
                    "default_external",
                    models.PositiveSmallIntegerField(default=4, help_text="J: groups from the pool per round."),
                ),
                ("sample_window_seconds", models.PositiveIntegerField(blank=True, null=True)),
                ("max_stored_bytes_per_node_hour", models.PositiveBigIntegerField(blank=True, null=True)),
                (
                    "catalogue_version",
                    models.PositiveIntegerField(default=0, help_text="The current SwarmCatalogue version."),
                ),
                (
                    "is_default",
                    models.BooleanField(default=False, help_text="Where a node that names no swarm goes."),
                ),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "ordering": ["-is_default", "slug"],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("is_default", True)), fields=("is_default",), name="swarms_one_default"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("slug", "any"), _negated=True), name="swarms_slug_not_any"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("default_external__lte", 256), ("default_local__lte", 256)),
                        name="swarms_ij",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="SwarmCatalogue",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("version", models.PositiveIntegerField()),
                ("entries", models.JSONField()),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "swarm",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="catalogues", to="swarms.swarm"
                    ),
                ),
            ],
            options={
                "ordering": ["swarm", "-version"],
                "constraints": [
                    models.UniqueConstraint(fields=("swarm", "version"), name="swarms_catalogue_version_unique")
                ],
            },
        ),
    ]
