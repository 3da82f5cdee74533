"""Alerts about a contributor's nodes (alerts.check, alerts.delivery, alerts.services): each condition
raises one alert and one message, stays quiet while it holds, clears with one recovery message; the
daily cap; the settings.

Email goes through Django's email framework (pytest-django's locmem backend: mail.outbox)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone
from factories import make_node, make_node_token, make_user
from test_web_data import make_group

from alerts.check import MIN_JUDGED, alerts_check
from alerts.models import Alert, AlertSettings, Condition
from alerts.services import alert_secret_rotate, alert_settings_update
from common.errors import ApplicationError
from nodes.models import Node
from nodes.services import node_token_revoke, node_token_rotate
from pool.models import NodeVerdictCounts, Verdict

pytestmark = pytest.mark.django_db


def _watched(*, silence: int = 30, min_acceptance: float = 0.5, email: str = "ada@example.org"):
    """A contributor with email alerts on and a node that has shared (and has a token)."""
    user = make_user(email=email, email_confirmed_at=timezone.now())
    AlertSettings.objects.create(
        user=user,
        email_alerts=True,
        silence_minutes=silence,
        min_acceptance=min_acceptance,
    )
    node = make_node(owner=user, name="laptop")
    make_node_token(node=node)
    NodeVerdictCounts.objects.create(node=node, accepted_groups=1)
    return user, node


def _seen(node: Node, when) -> None:
    Node.objects.filter(id=node.id).update(last_seen_at=when)


def test_a_silent_node_raises_one_alert_and_one_recovery():
    user, node = _watched(silence=30)
    now = timezone.now()
    _seen(node, now - timedelta(minutes=10))
    assert alerts_check(now=now).raised == 0 and mail.outbox == []

    _seen(node, now - timedelta(minutes=31))
    result = alerts_check(now=now)
    assert (result.raised, result.sent) == (1, 1)
    (alert,) = Alert.objects.filter(user=user)
    assert alert.condition == Condition.SILENT and alert.cleared_at is None
    assert alert.raised_delivery == "email" and alert.raised_sent
    (message,) = mail.outbox
    assert message.to == ["ada@example.org"] and message.subject == f"[SAPO Swarm] node {node.id}: silent"
    assert "Nothing heard from the node for 31 minutes" in message.body

    # still silent: nothing new, however often the job runs
    for later in (5, 60, 600):
        assert alerts_check(now=now + timedelta(minutes=later)).raised == 0
    assert len(mail.outbox) == 1 and Alert.objects.count() == 1

    _seen(node, now + timedelta(minutes=700))
    result = alerts_check(now=now + timedelta(minutes=701))
    assert (result.raised, result.cleared, result.sent) == (0, 1, 1)
    alert.refresh_from_db()
    assert alert.cleared_at is not None and alert.cleared_delivery == "email"
    assert mail.outbox[1].subject == f"[SAPO Swarm] node {node.id}: recovered (silent)"

    # silent again later: a new alert (the first one is closed)
    assert alerts_check(now=now + timedelta(minutes=800)).raised == 1
    assert Alert.objects.filter(user=user).count() == 2


def test_nodes_that_never_shared_or_were_quiet_for_long_raise_nothing():
    user, node = _watched()
    quiet = make_node(owner=user, name="never-shared")
    old = make_node(owner=user, name="abandoned")
    NodeVerdictCounts.objects.create(node=old, accepted_groups=3)
    now = timezone.now()
    _seen(quiet, now - timedelta(hours=5))
    _seen(old, now - timedelta(days=30))
    _seen(node, now)
    assert alerts_check(now=now).raised == 0


def test_contributors_without_a_channel_get_no_alerts():
    user, node = _watched(email="")
    _seen(node, timezone.now() - timedelta(hours=2))
    assert alerts_check().raised == 0 and not Alert.objects.exists()


def test_low_acceptance_over_the_last_hour_alerts_and_clears():
    user, node = _watched(min_acceptance=0.5)
    now = timezone.now()
    for _ in range(3):
        make_group(node, verdict=Verdict.REJECTED, created_at=now - timedelta(minutes=5))
    make_group(node, created_at=now - timedelta(minutes=5))
    make_group(node, verdict=Verdict.REJECTED, created_at=now - timedelta(hours=3))  # outside the hour
    result = alerts_check(now=now)
    assert result.raised == 1
    (alert,) = Alert.objects.all()
    assert alert.condition == Condition.LOW_ACCEPTANCE
    assert alert.detail.startswith("1 of 4 groups accepted in the last hour (25%, threshold 50%)")

    # an hour later the rejections have left the window: better groups clear it
    later = now + timedelta(hours=1, minutes=10)
    for _ in range(MIN_JUDGED):
        make_group(node, created_at=later - timedelta(minutes=1))
    assert alerts_check(now=later).cleared == 1


def test_too_few_judged_groups_say_nothing():
    user, node = _watched(min_acceptance=0.9)
    make_group(node, verdict=Verdict.REJECTED)
    make_group(node, verdict=Verdict.REJECTED)
    assert alerts_check().raised == 0


def test_a_banned_node_and_a_revoked_token_alert_without_a_silence_alert_too():
    user, node = _watched(silence=1)
    now = timezone.now()
    _seen(node, now - timedelta(hours=1))
    Node.objects.filter(id=node.id).update(banned_at=now)
    alerts_check(now=now)
    assert list(Alert.objects.values_list("condition", flat=True)) == [Condition.BANNED]

    Node.objects.filter(id=node.id).update(banned_at=None)
    node_token_revoke(node=node)
    alerts_check(now=now)
    rows = {a.condition: a for a in Alert.objects.all()}
    assert set(rows) == {Condition.BANNED, Condition.TOKEN_REVOKED}
    assert rows[Condition.BANNED].cleared_at is not None and rows[Condition.TOKEN_REVOKED].cleared_at is None

    node_token_rotate(node=node)  # a token again; still silent
    _seen(node, now)
    alerts_check(now=now)
    assert Alert.objects.filter(cleared_at__isnull=True).count() == 0


def test_the_daily_cap_lists_alerts_but_stops_sending(settings):
    settings.SAPO_ALERT_DAILY_CAP = 2
    user, node = _watched(silence=5)
    now = timezone.now()
    nodes = [node]
    for i in range(3):
        extra = make_node(owner=user, name=f"box-{i}")
        make_node_token(node=extra)
        NodeVerdictCounts.objects.create(node=extra, accepted_groups=1)
        nodes.append(extra)
    for n in nodes:
        _seen(n, now - timedelta(minutes=10))
    result = alerts_check(now=now)
    assert (result.raised, result.sent, result.capped) == (4, 2, 2)
    assert len(mail.outbox) == 2
    deliveries = sorted(Alert.objects.values_list("raised_delivery", flat=True))
    assert deliveries == ["capped (daily limit reached)"] * 2 + ["email"] * 2
    # a day later the cap has room again
    for n in nodes:
        _seen(n, now + timedelta(days=1, minutes=1))
    assert alerts_check(now=now + timedelta(days=1, minutes=2)).sent == 2


def test_settings_are_validated_and_the_secret_made_once(settings):
    user = make_user()
    for url, code in [
        ("ftp://example.org/x", "webhook_invalid"),
        ("https://user:pw@example.org/x", "webhook_invalid"),
        ("http://127.0.0.1:8000/hook", "webhook_refused"),
        ("http://10.1.2.3/hook", "webhook_refused"),
        ("http://169.254.169.254/latest/meta-data", "webhook_refused"),
        ("http://[::1]/hook", "webhook_refused"),
        ("http://localhost/hook", "webhook_refused"),
    ]:
        with pytest.raises(ApplicationError) as exc:
            alert_settings_update(
                user=user, email_alerts=False, webhook_url=url, silence_minutes=30, min_acceptance=0.5
            )
        assert exc.value.code == code, url
    with pytest.raises(ApplicationError) as exc:
        alert_settings_update(user=user, email_alerts=False, webhook_url="", silence_minutes=0, min_acceptance=0.5)
    assert exc.value.code == "silence_invalid"
    assert not AlertSettings.objects.filter(user=user).exists()  # nothing stored from bad input

    settings.SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    row, secret = alert_settings_update(
        user=user, email_alerts=False, webhook_url="http://127.0.0.1:9/hook", silence_minutes=15, min_acceptance=0.25
    )
    assert secret and secret.startswith("whsec_") and row.webhook_secret == secret
    _, again = alert_settings_update(
        user=user, email_alerts=False, webhook_url="http://127.0.0.1:10/hook", silence_minutes=15, min_acceptance=0.25
    )
    assert again is None  # a changed URL keeps the secret
    rotated = alert_secret_rotate(user=user)
    assert rotated != secret and AlertSettings.objects.get(user=user).webhook_secret == rotated


def test_the_scheduled_command_prints_the_alert_with_the_console_backend(settings, capsys):
    """What `make run` shows: the scheduled command's alerts job, its email on the console."""
    from django.core.management import call_command

    settings.EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
    user, node = _watched(silence=30, email="demo@localhost")
    _seen(node, timezone.now() - timedelta(minutes=45))
    call_command("sapo_scheduled", only=["alerts"])
    out = capsys.readouterr().out
    assert "alerts: ok" in out and "alerts raised 1, cleared 0; messages sent 1" in out
    assert "To: demo@localhost" in out and f"Subject: [SAPO Swarm] node {node.id}: silent" in out
    _seen(node, timezone.now())
    call_command("sapo_scheduled", only=["alerts"])
    out = capsys.readouterr().out
    assert "alerts raised 0, cleared 1; messages sent 1" in out and f"node {node.id}: recovered (silent)" in out


def test_a_second_check_while_one_runs_does_nothing(settings):
    """Two schedulers at once must not announce the same alert twice: the second check backs off."""
    import psycopg
    from django.db import connection

    from alerts import check

    user, node = _watched(silence=5)
    _seen(node, timezone.now() - timedelta(minutes=10))
    params = connection.get_connection_params()
    dsn = {k: params[k] for k in ("dbname", "user", "host", "port") if params.get(k)}
    with psycopg.connect(**dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [check._LOCK_KEY])
        assert alerts_check().raised == 0 and not Alert.objects.exists()
        # Unlocked here, not by closing: a closed session's locks go when its backend has exited, which
        # the next statement on another connection may come before.
        other.execute("SELECT pg_advisory_unlock(%s)", [check._LOCK_KEY])
    assert alerts_check().raised == 1
