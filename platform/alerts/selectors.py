"""Reads of the alerts app, for /me/ (web)."""

from __future__ import annotations

from accounts.models import User
from alerts.models import Alert, AlertSettings

#: Alerts listed on /me/, newest first.
ALERT_LIST_LIMIT = 50


def alert_settings_get(*, user: User) -> AlertSettings:
    """The contributor's settings (defaults, unsaved, when they never set any)."""
    return AlertSettings.objects.filter(user=user).first() or AlertSettings(user=user)


def alert_list(*, user: User, limit: int = ALERT_LIST_LIMIT) -> list[Alert]:
    return list(Alert.objects.filter(user=user).select_related("node")[:limit])
