"""Writes of a contributor's alert settings: the /me/ form, the webhook secret, and their deletion with
the account. The check that raises and clears alerts is `alerts.check`; how a message goes out,
`alerts.delivery`."""

from __future__ import annotations

import secrets

from accounts.models import User
from alerts import webhooks
from alerts.models import Alert, AlertSettings
from common.errors import ApplicationError

SECRET_PREFIX = "whsec_"


def alert_settings_update(
    *,
    user: User,
    email_alerts: bool,
    webhook_url: str,
    silence_minutes: int,
    min_acceptance: float,
) -> tuple[AlertSettings, str | None]:
    """Save the contributor's settings; returns (settings, the new webhook secret or None).

    Email alerts go to the account's address (accounts.addresses) while it is confirmed; the account
    sets and confirms it, not these settings. A secret is made when a webhook URL is first set (shown
    once by the caller); changing the URL keeps it. The URL is stored in ASCII (webhooks.normalise_url)
    and checked now (form and resolved addresses) and again at every delivery; a refused one raises
    WebhookRefused, field webhook_url."""
    webhook_url = webhook_url.strip()
    if webhook_url:
        webhook_url = webhooks.normalise_url(webhook_url)
        webhooks.resolve_target(webhook_url)
    if not 1 <= silence_minutes <= 24 * 60:
        raise ApplicationError("silence_invalid", "Silence must be between 1 and 1440 minutes.")
    if not 0.0 <= min_acceptance <= 1.0:
        raise ApplicationError("acceptance_invalid", "The acceptance threshold must be between 0 and 100 %.")
    row, _ = AlertSettings.objects.get_or_create(user=user)
    new_secret = None
    if webhook_url and not row.webhook_secret:
        new_secret = row.webhook_secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    row.email_alerts, row.webhook_url = bool(email_alerts), webhook_url
    row.silence_minutes, row.min_acceptance = silence_minutes, min_acceptance
    row.save()
    return row, new_secret


def alerts_forget(*, user: User) -> int:
    """Delete an account's alert settings and alerts (its deletion: web.account). Returns alerts deleted."""
    AlertSettings.objects.filter(user=user).delete()
    deleted, _ = Alert.objects.filter(user=user).delete()
    return deleted


def alert_secret_rotate(*, user: User) -> str:
    """A new webhook secret (the old one stops signing at once); returns it, to be shown once."""
    row = AlertSettings.objects.filter(user=user).first()
    if row is None or not row.webhook_url:
        raise ApplicationError("no_webhook", "Set a webhook URL first.")
    row.webhook_secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    row.save(update_fields=["webhook_secret", "updated_at"])
    return row.webhook_secret
