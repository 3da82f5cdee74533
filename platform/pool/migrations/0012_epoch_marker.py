"""The pool's epoch marker: one row whose `xmin` and random token enter the pool's epoch, so that a
restore of the pool's contents, which inserts the row again, changes the epoch (sockets.epoch). The row is
made by sockets.epoch when it finds none, not here."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0011_ledger_partitions"),
    ]

    operations = [
        migrations.CreateModel(
            name="EpochMarker",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                (
                    "token",
                    models.UUIDField(help_text="Random, drawn when the row is made; a row made again draws another."),
                ),
            ],
            options={
                "constraints": [models.CheckConstraint(condition=models.Q(("id", 1)), name="pool_epochmarker_one_row")],
            },
        ),
    ]
