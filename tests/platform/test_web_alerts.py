"""The alerts panel of /me/: settings saved through the form, the webhook secret shown once, bad
input answered with a message and nothing stored, every alert listed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import Alert, AlertSettings, Condition

pytestmark = pytest.mark.django_db


def _save(client, **fields):
    data = {"webhook_url": "", "silence_minutes": "30", "min_acceptance": "50", **fields}
    return client.post("/me/alerts/", data, follow=True)


def test_the_panel_shows_the_defaults(auth_client):
    page = auth_client.get("/me/").content.decode()
    panel = page[page.index('id="alerts"') :]
    assert 'name="silence_minutes" type="number" min="1" max="1440" value="30"' in panel
    assert 'value="50"' in panel and "No alerts yet." in panel


def test_email_settings_are_saved(auth_client, user):
    page = _save(auth_client, email_alerts="on", silence_minutes="45", min_acceptance="80").content.decode()
    assert "Alert settings saved." in page and "Email alerts wait for a confirmed address" in page
    row = AlertSettings.objects.get(user=user)
    assert (row.email_alerts, row.silence_minutes, row.min_acceptance, row.webhook_secret) == (True, 45, 0.8, "")


def test_the_webhook_secret_is_shown_once(auth_client, user, settings):
    settings.SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    response = auth_client.post(
        "/me/alerts/", {"webhook_url": "http://127.0.0.1:9/hook", "silence_minutes": "30", "min_acceptance": "50"}
    )
    secret = AlertSettings.objects.get(user=user).webhook_secret
    page = response.content.decode()
    assert secret.startswith("whsec_") and secret in page and "It is shown only once." in page
    assert "no-cache" in response["Cache-Control"]
    assert secret not in auth_client.get("/me/").content.decode()
    rotated = auth_client.post("/me/alerts/secret/").content.decode()
    new = AlertSettings.objects.get(user=user).webhook_secret
    assert new != secret and new in rotated


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"webhook_url": "http://192.168.0.10/hook"}, "resolves to an address that is not public"),
        ({"webhook_url": "javascript:alert(1)"}, "must start with https://"),
        ({"silence_minutes": "0"}, "between 1 and 1440 minutes"),
        ({"silence_minutes": "soon"}, "Silence minutes must be a number"),
    ],
)
def test_bad_input_is_refused_with_a_message(auth_client, user, fields, message):
    page = _save(auth_client, **fields).content.decode()
    assert message in page
    assert not AlertSettings.objects.filter(user=user).exists()


def test_alerts_are_listed_with_what_became_of_them(auth_client, user, node):
    now = timezone.now()
    Alert.objects.create(
        user=user,
        node=node,
        condition=Condition.SILENT,
        detail="Nothing heard for 31 minutes.",
        raised_at=now - timedelta(hours=2),
        raised_delivery="email",
        raised_sent=True,
        cleared_at=now - timedelta(hours=1),
        cleared_delivery="email",
        cleared_sent=True,
    )
    Alert.objects.create(
        user=user,
        node=node,
        condition=Condition.BANNED,
        detail="<b>banned</b>",
        raised_at=now,
        raised_delivery="capped (daily limit reached)",
    )
    page = auth_client.get("/me/").content.decode()
    table = page[page.index('id="alert-list"') :]
    assert "Nothing heard for 31 minutes." in table and "capped (daily limit reached)" in table
    assert "not yet" in table and "&lt;b&gt;banned&lt;/b&gt;" in table


def test_alert_forms_need_a_login_and_a_post(client, auth_client):
    assert client.post("/me/alerts/", {}).status_code == 302
    assert client.post("/accounts/email/confirmation/").status_code == 302
    assert auth_client.get("/me/alerts/").status_code == 405
    assert auth_client.get("/accounts/email/confirmation/").status_code == 405
