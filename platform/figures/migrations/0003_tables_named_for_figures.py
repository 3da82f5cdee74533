"""The folded figures' tables take their app's name (figures_nodestats, figures_nodehour,
figures_datasethour, figures_statscursor): a rename in place, no row copied. Their indexes and
constraints keep the names they were made with."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("figures", "0002_per_swarm"),
    ]

    operations = [
        migrations.AlterModelTable(name="datasethour", table=None),
        migrations.AlterModelTable(name="nodehour", table=None),
        migrations.AlterModelTable(name="nodestats", table=None),
        migrations.AlterModelTable(name="statscursor", table=None),
    ]
