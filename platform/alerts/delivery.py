"""How an alert's message goes out: its share of the contributor's daily caps reserved, then sent by email
and/or webhook (`alerts.webhooks`), and how it went recorded on the alert."""

from __future__ import annotations

import json
import logging
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mail

from alerts import webhooks
from alerts.models import Alert, AlertSettings, Channel, Condition, Transmission
from nodes.models import Node

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    """An alert just raised, or just cleared (`recovered`), to be told to its contributor."""

    alert: Alert
    recovered: bool


@dataclass
class _Plan:
    """What one message may send: `emails` (0 or 1) and `posts` (webhook POSTs, retries included)."""

    message: Message
    prefs: AlertSettings
    emails: int
    posts: int


def messages_reserve(messages: list[Message], prefs_by_user: dict[int, AlertSettings], now: datetime) -> list[Outgoing]:
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


def messages_send(outgoing: list[Outgoing]) -> tuple[int, int, int]:
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
class Outgoing:
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


def _outgoing(message: Message, prefs: AlertSettings, *, emails: int, posts: int, reserved: list[int]) -> Outgoing:
    subject, text = alert_text(message.alert, recovered=message.recovered)
    payload = alert_payload(message.alert, recovered=message.recovered) if prefs.webhook_url else b""
    email = _confirmed_email(prefs)
    return Outgoing(
        message, email, subject, text, prefs.webhook_url, prefs.webhook_secret, payload, emails, posts, reserved
    )


def _transmit(out: Outgoing) -> _Result:
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
