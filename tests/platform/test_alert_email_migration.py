"""Migration alerts 0004: an alert address becomes the account's one address (its confirmation kept)
when the account had none or the same one; email alerts stay on either way; an account's own,
different address is kept."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from factories import make_user

from accounts.models import User
from alerts.models import AlertSettings

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("alerts", "0003_email_confirmation")]
AFTER = [("alerts", "0004_alert_email_is_the_account_address")]


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return MigrationExecutor(connection)


def test_alert_addresses_become_the_account_address():
    confirmed_at = timezone.now()
    none, same, other, off = (make_user(username=name) for name in ("none", "same", "other", "off"))
    User.objects.filter(id=same.id).update(email="Same@example.org")
    User.objects.filter(id=other.id).update(email="own@example.org")
    executor = _migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps.get_model("alerts", "AlertSettings")
        old.objects.create(user_id=none.id, email="none@example.org", email_confirmed_at=confirmed_at)
        old.objects.create(user_id=same.id, email="same@example.org", email_confirmed_at=confirmed_at)
        old.objects.create(user_id=other.id, email="alerts@example.org", email_confirmed_at=confirmed_at)
        old.objects.create(user_id=off.id, email="")
    finally:
        _migrate(AFTER)
    users = {u.username: (u.email, u.email_confirmed_at) for u in User.objects.all()}
    assert users["none"] == ("none@example.org", confirmed_at)
    assert users["same"] == ("same@example.org", confirmed_at)
    assert users["other"] == ("own@example.org", None)
    assert users["off"] == ("", None)
    alerts_on = dict(AlertSettings.objects.values_list("user__username", "email_alerts"))
    assert alerts_on == {"none": True, "same": True, "other": True, "off": False}
