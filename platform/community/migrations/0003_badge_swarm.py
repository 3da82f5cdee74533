"""Badges earned in one swarm (its rank badges): a swarm column, none for the whole site's badges,
which keep their uniqueness per holder and kind."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("community", "0002_team_name_skeleton_and_lock"),
        ("swarms", "0002_default_swarm"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="badge",
            name="community_badge_user_unique",
        ),
        migrations.RemoveConstraint(
            model_name="badge",
            name="community_badge_team_unique",
        ),
        migrations.AddField(
            model_name="badge",
            name="swarm",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="swarms.swarm",
            ),
        ),
        migrations.AddConstraint(
            model_name="badge",
            constraint=models.UniqueConstraint(
                condition=models.Q(("swarm__isnull", True), ("user__isnull", False)),
                fields=("user", "kind"),
                name="community_badge_user_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="badge",
            constraint=models.UniqueConstraint(
                condition=models.Q(("swarm__isnull", True), ("team__isnull", False)),
                fields=("team", "kind"),
                name="community_badge_team_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="badge",
            constraint=models.UniqueConstraint(
                condition=models.Q(("swarm__isnull", False), ("user__isnull", False)),
                fields=("user", "kind", "swarm"),
                name="community_badge_user_swarm_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="badge",
            constraint=models.UniqueConstraint(
                condition=models.Q(("swarm__isnull", False), ("team__isnull", False)),
                fields=("team", "kind", "swarm"),
                name="community_badge_team_swarm_unique",
            ),
        ),
    ]
