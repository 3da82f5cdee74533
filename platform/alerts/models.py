"""A contributor's alert settings and the alerts raised about their nodes (docs/community.md, "Alerts")."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

WEBHOOK_URL_MAX_LENGTH = 500


class AlertSettings(models.Model):
    """Where a contributor's alerts go, and when a node counts as stalled. No row: no alerts."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="alert_settings"
    )
    #: Alerts by email, to the account's address (accounts.addresses) while it is confirmed.
    email_alerts = models.BooleanField(default=False)
    webhook_url = models.CharField(max_length=WEBHOOK_URL_MAX_LENGTH, blank=True)
    #: Signs every webhook POST (HMAC-SHA256). Kept in clear because signing needs it; shown once.
    webhook_secret = models.CharField(max_length=80, blank=True)
    silence_minutes = models.PositiveIntegerField(
        default=30, validators=[MinValueValidator(1), MaxValueValidator(24 * 60)]
    )
    min_acceptance = models.FloatField(default=0.5, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "alert settings"

    def __str__(self) -> str:
        return f"alert settings of {self.user_id}"


class Condition(models.TextChoices):
    SILENT = "silent", "Silent"
    LOW_ACCEPTANCE = "low_acceptance", "Low acceptance"
    BANNED = "banned", "Banned"
    TOKEN_REVOKED = "token_revoked", "Token revoked"


class Alert(models.Model):
    """One episode of a condition on a node: raised once, cleared once when the node recovers.

    `raised_delivery` and `cleared_delivery` say what became of each message ("email, webhook",
    "capped", "webhook failed: ...")."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+")
    condition = models.CharField(max_length=32, choices=Condition.choices)
    detail = models.CharField(max_length=300)
    raised_at = models.DateTimeField(default=timezone.now)
    raised_delivery = models.CharField(max_length=300, blank=True)
    raised_sent = models.BooleanField(default=False)
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_delivery = models.CharField(max_length=300, blank=True)
    cleared_sent = models.BooleanField(default=False)

    class Meta:
        ordering = ["-raised_at", "-id"]
        indexes = [models.Index(fields=["user", "-raised_at"], name="alerts_alert_user_raised")]
        constraints = [
            # One open alert per node and condition: the next comes only after it cleared.
            models.UniqueConstraint(
                fields=["node", "condition"], condition=Q(cleared_at__isnull=True), name="alerts_alert_one_open"
            )
        ]

    def __str__(self) -> str:
        return f"{self.condition} on node {self.node_id} at {self.raised_at:%Y-%m-%d %H:%M}"


class Channel(models.TextChoices):
    EMAIL = "email", "Email"
    WEBHOOK = "webhook", "Webhook POST"


class Transmission(models.Model):
    """One email or one webhook POST (a retry is another) sent, or reserved to be sent, to a contributor's
    address: what the daily caps count (docs/community.md, "Alerts"). Rows older than a day are pruned."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["user", "channel", "at"], name="alerts_transmission_user")]

    def __str__(self) -> str:
        return f"{self.channel} to {self.user_id} at {self.at:%Y-%m-%d %H:%M}"
