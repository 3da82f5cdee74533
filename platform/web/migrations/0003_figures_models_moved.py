"""The folded figures' models belong to the figures app (figures 0001); their tables stay as they are."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("web", "0002_datasethour_swarm"),
        ("figures", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="NodeStats"),
                migrations.DeleteModel(name="NodeHour"),
                migrations.DeleteModel(name="DatasetHour"),
                migrations.DeleteModel(name="StatsCursor"),
            ]
        )
    ]
