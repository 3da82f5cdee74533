"""Alerts: a contributor's settings, and the check that raises and clears alerts about their nodes.

`alerts_check` (the scheduled job `alerts`) looks at every node of a contributor with alerts on:

- silent: the node has shared groups, was seen in the last SILENT_HORIZON, and has sent nothing
  for the contributor's `silence_minutes`; clears when it is heard from again;
- low_acceptance: over the last hour at least MIN_JUDGED of its groups were judged and the
  accepted share is below the contributor's `min_acceptance`; clears when the last hour's share is
  back at it or above (with as many judged);
- banned: the node or its contributor is banned; clears when lifted;
- token_revoked: the node has had tokens and none is active; clears when one is.

A retired node raises nothing (its owner retired it); a banned node or one without a token is not
also reported silent or low. One alert per node and condition stays open until it clears (a
database constraint); raising and clearing each send one message, by email and/or webhook, unless
the contributor already had `SAPO_ALERT_DAILY_CAP` messages in the last 24 hours (the alert is
still listed on /me/, its delivery "capped").
"""

from __future__ import annotations

import json
import logging
import secrets
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from accounts.models import User
from alerts import webhooks
from alerts.models import Alert, AlertSettings, Channel, Condition, Transmission
from common.errors import ApplicationError
from nodes.models import Node, NodeToken
from pool.models import NodeVerdictCounts, Rollout, Verdict

log = logging.getLogger(__name__)

#: A node quiet for longer than this before alerts were looked at is not reported silent (an old,
#: abandoned node is not news); one already reported stays open until it is heard from.
SILENT_HORIZON = timedelta(days=7)
ACCEPTANCE_WINDOW = timedelta(hours=1)
#: Judged groups in the window below which the acceptance share says nothing either way.
MIN_JUDGED = 4
SECRET_PREFIX = "whsec_"
_LOCK_KEY = 0x5A90_A1E7  # pg advisory lock id of the alerts check


# ---------------------------------------------------------------------------- settings


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


# ---------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class Message:
    alert: Alert
    recovered: bool


@dataclass(frozen=True)
class CheckResult:
    raised: int
    cleared: int
    sent: int
    capped: int
    failed: int

    def line(self) -> str:
        return (
            f"alerts raised {self.raised}, cleared {self.cleared}; messages sent {self.sent}, capped {self.capped}, "
            f"failed {self.failed}"
        )


def _conditions(
    node: Node,
    prefs: AlertSettings,
    now: datetime,
    *,
    judged: tuple[int, int],
    shared: bool,
    has_tokens: bool,
    has_active_token: bool,
) -> dict[str, str | None]:
    """{condition: detail when it holds, None when it does not, absent when it cannot be told}."""
    out: dict[str, str | None] = {}
    banned = node.is_banned
    out[Condition.BANNED] = "The node or its contributor is banned from the swarm." if banned else None
    revoked = has_tokens and not has_active_token
    out[Condition.TOKEN_REVOKED] = "The node has no active token: it cannot connect." if revoked else None
    if banned or revoked:
        out[Condition.SILENT] = out[Condition.LOW_ACCEPTANCE] = None
        return out
    silence = timedelta(minutes=prefs.silence_minutes)
    if shared and node.last_seen_at is not None:
        quiet = now - node.last_seen_at
        if quiet > silence:
            minutes = int(quiet.total_seconds() // 60)
            out[Condition.SILENT] = f"Nothing heard from the node for {minutes} minute{'s' if minutes != 1 else ''}."
        else:
            out[Condition.SILENT] = None
        if quiet > silence and now - node.last_seen_at > SILENT_HORIZON:
            out.pop(Condition.SILENT)  # too old to raise; an open alert stays open
    accepted, rejected = judged
    if accepted + rejected >= MIN_JUDGED:
        share = accepted / (accepted + rejected)
        low = share < prefs.min_acceptance
        out[Condition.LOW_ACCEPTANCE] = (
            f"{accepted} of {accepted + rejected} groups accepted in the last hour ({share:.0%}, "
            f"threshold {prefs.min_acceptance:.0%})."
            if low
            else None
        )
    return out


def alerts_check(*, now: datetime | None = None) -> CheckResult:
    """Raise and clear alerts for every contributor with alerts on, then send the messages.

    One check decides at a time: a PostgreSQL advisory lock is held while it raises and clears alerts
    and reserves its messages' share of the daily caps (Transmission rows), and released before any
    message is sent, so a receiver that takes its whole deadline holds no lock; a second check
    meanwhile returns at once, so no alert is cleared and announced twice."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return CheckResult(0, 0, 0, 0, 0)
    try:
        raised, cleared, messages, prefs_by_user = _check(now)
        outgoing = _reserve(messages, prefs_by_user, now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])
    sent, capped, failed = _send_all(outgoing)
    return CheckResult(raised, cleared, sent, capped, failed)


def _check(now: datetime) -> tuple[int, int, list[Message], dict[int, AlertSettings]]:
    """The alerts raised and cleared now: (raised, cleared, their messages, the settings by user)."""
    prefs_by_user = {
        p.user_id: p
        for p in AlertSettings.objects.filter(
            Q(email_alerts=True, user__email_confirmed_at__isnull=False) & ~Q(user__email="") | ~Q(webhook_url="")
        ).select_related("user")
    }
    nodes = list(Node.objects.filter(owner_id__in=prefs_by_user, retired_at__isnull=True).select_related("owner"))
    ids = [n.id for n in nodes]
    shared = set(NodeVerdictCounts.objects.filter(node_id__in=ids).values_list("node_id", flat=True))
    tokens = {
        row["node_id"]: row
        for row in NodeToken.objects.filter(node_id__in=ids)
        .values("node_id")
        .annotate(total=Count("id"), active=Count("id", filter=Q(revoked_at__isnull=True)))
    }
    judged = {
        row["node_id"]: (row["accepted"], row["rejected"])
        for row in Rollout.objects.filter(node_id__in=ids, created_at__gte=now - ACCEPTANCE_WINDOW)
        .values("node_id")
        .annotate(
            accepted=Count("id", filter=Q(verdict=Verdict.ACCEPTED)),
            rejected=Count("id", filter=Q(verdict=Verdict.REJECTED)),
        )
    }
    open_alerts = {
        (a.node_id, a.condition): a
        for a in Alert.objects.filter(node_id__in=ids, cleared_at__isnull=True).select_related("node")
    }

    messages: list[Message] = []
    raised = cleared = 0
    for node in nodes:
        token_row = tokens.get(node.id, {"total": 0, "active": 0})
        states = _conditions(
            node,
            prefs_by_user[node.owner_id],
            now,
            judged=judged.get(node.id, (0, 0)),
            shared=node.id in shared,
            has_tokens=token_row["total"] > 0,
            has_active_token=token_row["active"] > 0,
        )
        for condition, detail in states.items():
            current = open_alerts.get((node.id, condition))
            if detail is not None and current is None:
                alert = _raise(node, condition, detail, now)
                if alert is not None:
                    raised += 1
                    messages.append(Message(alert, recovered=False))
            elif detail is None and current is not None:
                current.cleared_at = now
                current.save(update_fields=["cleared_at"])
                cleared += 1
                messages.append(Message(current, recovered=True))
    return raised, cleared, messages, prefs_by_user


def _raise(node: Node, condition: str, detail: str, now: datetime) -> Alert | None:
    """A new open alert, or None when another check opened the same one first."""
    try:
        with transaction.atomic():
            return Alert.objects.create(
                user_id=node.owner_id, node=node, condition=condition, detail=detail, raised_at=now
            )
    except IntegrityError:
        return None


# ---------------------------------------------------------------------------- delivery


@dataclass
class _Plan:
    """What one message may send: `emails` (0 or 1) and `posts` (webhook POSTs, retries included)."""

    message: Message
    prefs: AlertSettings
    emails: int
    posts: int


def _reserve(messages: list[Message], prefs_by_user: dict[int, AlertSettings], now: datetime) -> list[_Outgoing]:
    """Each message with what it may send under its contributor's daily caps, reserved as Transmission rows
    (a concurrent check counts them): an email, and a first POST, for each message in turn while the cap
    lasts, then retries (up to webhooks.BACKOFF's count each) from what is left."""
    Transmission.objects.filter(at__lt=now - timedelta(days=1)).delete()
    since = now - timedelta(days=1)
    left: dict[tuple[int, str], int] = {}

    def take(user_id: int, channel: str, wanted: int) -> int:
        key = (user_id, channel)
        if key not in left:
            used = Transmission.objects.filter(user_id=user_id, channel=channel, at__gte=since).count()
            left[key] = max(0, settings.SAPO_ALERT_DAILY_CAP - used)
        granted = min(wanted, left[key])
        left[key] -= granted
        return granted

    plans = []
    for message in messages:
        prefs = prefs_by_user[message.alert.user_id]
        emails = take(prefs.user_id, Channel.EMAIL, 1) if _confirmed_email(prefs) else 0
        posts = take(prefs.user_id, Channel.WEBHOOK, 1) if prefs.webhook_url else 0
        plans.append(_Plan(message, prefs, emails, posts))
    for plan in plans:
        if plan.posts:
            plan.posts += take(plan.prefs.user_id, Channel.WEBHOOK, len(webhooks.BACKOFF))
    outgoing = []
    for plan in plans:
        user_id = plan.prefs.user_id
        rows = Transmission.objects.bulk_create(
            [Transmission(user_id=user_id, channel=Channel.EMAIL, at=now) for _ in range(plan.emails)]
            + [Transmission(user_id=user_id, channel=Channel.WEBHOOK, at=now) for _ in range(plan.posts)]
        )
        outgoing.append(
            _outgoing(plan.message, plan.prefs, emails=plan.emails, posts=plan.posts, reserved=[r.id for r in rows])
        )
    return outgoing


def _send_all(outgoing: list[_Outgoing]) -> tuple[int, int, int]:
    """Send the messages, SAPO_ALERT_SEND_THREADS at a time (a receiver that takes its webhook's whole
    deadline holds up no one else's message), record on each alert how its message went, and give back
    the reservations a message did not use."""
    with ThreadPoolExecutor(max_workers=max(1, settings.SAPO_ALERT_SEND_THREADS)) as pool:
        results = list(pool.map(_transmit, outgoing))
    sent = capped = failed = 0
    unused: list[int] = []
    for out, result in zip(outgoing, results, strict=True):
        if not out.emails and not out.posts:
            capped += 1
        elif result.arrived:
            sent += 1
        else:
            failed += 1
        emails_reserved, posts_reserved = out.reserved[: out.emails], out.reserved[out.emails :]
        unused += emails_reserved[result.emails :] + posts_reserved[result.posts :]
        alert, note = out.message.alert, result.note[:300]
        if out.message.recovered:
            alert.cleared_delivery, alert.cleared_sent = note, result.arrived
            alert.save(update_fields=["cleared_delivery", "cleared_sent"])
        else:
            alert.raised_delivery, alert.raised_sent = note, result.arrived
            alert.save(update_fields=["raised_delivery", "raised_sent"])
    Transmission.objects.filter(id__in=unused).delete()
    return sent, capped, failed


#: Characters of a node's name an alert's body keeps.
NAME_IN_BODY = 40


def node_label(node: Node) -> str:
    """The node's name for an alert's body: printable characters only, one line, at most NAME_IN_BODY."""
    name = " ".join("".join(c for c in node.name if unicodedata.category(c)[0] not in "CZ" or c == " ").split())
    return name if len(name) <= NAME_IN_BODY else name[: NAME_IN_BODY - 1] + "…"


def alert_text(alert: Alert, *, recovered: bool) -> tuple[str, str]:
    """(subject, body) of the message about `alert`. The subject names the node by its id, never by the
    name its owner typed; the body gives the name too, cleaned and bounded (node_label)."""
    label = Condition(alert.condition).label.lower()
    node = f"node {alert.node_id} ({node_label(alert.node)})"
    if recovered:
        subject = f"[SAPO Swarm] node {alert.node_id}: recovered ({label})"
        body = f"Your {node} recovered: {label} since {alert.raised_at:%Y-%m-%d %H:%M} UTC, cleared {alert.cleared_at:%Y-%m-%d %H:%M} UTC."
    else:
        subject = f"[SAPO Swarm] node {alert.node_id}: {label}"
        body = f"Your {node}: {alert.detail}"
    return subject, body + "\n\nAlerts and their settings: your page on the site (/me/)."


def alert_payload(alert: Alert, *, recovered: bool) -> bytes:
    """The webhook body: a small JSON object."""
    at = alert.cleared_at if recovered else alert.raised_at
    return json.dumps(
        {
            "type": "recovered" if recovered else "alert",
            "alert": alert.id,
            "condition": alert.condition,
            "node": {"id": alert.node_id, "name": alert.node.name},
            "detail": alert.detail,
            "at": at.isoformat() if at else None,
        },
        separators=(",", ":"),
    ).encode()


@dataclass(frozen=True)
class _Outgoing:
    """One message as its channels carry it, made before sending (the send threads touch no database),
    with what the daily caps let it send: `emails` (0 or 1) and `posts` (webhook POSTs, retries included)."""

    message: Message
    email: str
    subject: str
    text: str
    webhook_url: str
    webhook_secret: str
    payload: bytes
    emails: int
    posts: int
    #: Transmission ids reserved for it: the emails', then the posts'.
    reserved: list[int]


@dataclass(frozen=True)
class _Result:
    note: str
    arrived: bool
    emails: int
    posts: int


def _confirmed_email(prefs: AlertSettings) -> str:
    """The address alerts may go to: the account's, once confirmed and while email alerts are on; else none."""
    user = prefs.user
    return user.email if prefs.email_alerts and user.email and user.email_confirmed_at is not None else ""


def _outgoing(message: Message, prefs: AlertSettings, *, emails: int, posts: int, reserved: list[int]) -> _Outgoing:
    subject, text = alert_text(message.alert, recovered=message.recovered)
    payload = alert_payload(message.alert, recovered=message.recovered) if prefs.webhook_url else b""
    email = _confirmed_email(prefs)
    return _Outgoing(
        message, email, subject, text, prefs.webhook_url, prefs.webhook_secret, payload, emails, posts, reserved
    )


def _transmit(out: _Outgoing) -> _Result:
    """Send one message by every channel the contributor set and the caps allow. Whatever one channel
    raises is caught and noted here, for this message alone: the others are still sent and recorded."""
    notes, arrived, emails, posts = [], False, 0, 0
    if out.email:
        if not out.emails:
            notes.append("email " + webhooks.CAPPED)
        else:
            emails = 1
            try:
                send_mail(out.subject, out.text, None, [out.email], fail_silently=False)
                notes.append("email")
                arrived = True
            except Exception as exc:  # smtplib's errors, a bad header, anything else: this message's failure
                log.warning("alert %s: email failed: %s: %s", out.message.alert.id, type(exc).__name__, exc)
                notes.append(f"email failed: {type(exc).__name__}")
    if out.webhook_url:
        if not out.posts:
            notes.append("webhook " + webhooks.CAPPED)
        else:

            def may_post() -> bool:
                nonlocal posts
                posts += 1
                return posts <= out.posts

            try:
                failure = webhooks.deliver(out.webhook_url, out.webhook_secret, out.payload, may_post=may_post)
            except Exception as exc:  # anything a receiver or a stored URL can provoke: this message's failure
                log.warning("alert %s: webhook failed: %s: %s", out.message.alert.id, type(exc).__name__, exc)
                failure = f"{type(exc).__name__}: {exc}"[:200]
            posts = min(posts, out.posts)
            notes.append(f"webhook failed: {failure}" if failure else "webhook")
            arrived = arrived or not failure
    if not out.emails and not out.posts:
        return _Result(webhooks.CAPPED, False, 0, 0)
    return _Result(", ".join(notes), arrived, emails, posts)
