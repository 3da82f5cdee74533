from django.db import migrations, models


def move_addresses_to_accounts(apps, schema_editor):
    """An account has one address (accounts.User.email), which alerts use once confirmed. An alert
    address becomes the account's when the account had none or the same one (its confirmation kept);
    either way email alerts stay on. An account whose own address differs keeps its own: alerts go
    there once that one is confirmed."""
    AlertSettings = apps.get_model("alerts", "AlertSettings")
    User = apps.get_model("accounts", "User")
    for row in AlertSettings.objects.exclude(email="").iterator():
        user = User.objects.get(id=row.user_id)
        if not user.email or user.email.lower() == row.email.lower():
            if user.email_confirmed_at is None:
                user.email_confirmed_at = row.email_confirmed_at
            user.email = row.email
            user.save(update_fields=["email", "email_confirmed_at"])
        row.email_alerts = True
        row.save(update_fields=["email_alerts"])


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0005_user_email_confirmed_at"),
        ("alerts", "0003_email_confirmation"),
    ]

    operations = [
        migrations.AddField(
            model_name="alertsettings",
            name="email_alerts",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(move_addresses_to_accounts, migrations.RunPython.noop),
        migrations.RemoveIndex(
            model_name="transmission",
            name="alerts_transmission_address",
        ),
        migrations.RemoveField(
            model_name="alertsettings",
            name="email",
        ),
        migrations.RemoveField(
            model_name="alertsettings",
            name="email_confirmation_sent_at",
        ),
        migrations.RemoveField(
            model_name="alertsettings",
            name="email_confirmed_at",
        ),
        migrations.RemoveField(
            model_name="transmission",
            name="address_hash",
        ),
        migrations.AlterField(
            model_name="transmission",
            name="channel",
            field=models.CharField(choices=[("email", "Email"), ("webhook", "Webhook POST")], max_length=16),
        ),
    ]
