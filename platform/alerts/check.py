"""The check that raises and clears alerts about contributors' nodes.

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

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from alerts.delivery import Message, messages_reserve, messages_send
from alerts.models import Alert, AlertSettings, Condition
from nodes.models import Node, NodeToken
from pool.models import NodeVerdictCounts, Rollout, Verdict

#: A node quiet for longer than this before alerts were looked at is not reported silent (an old,
#: abandoned node is not news); one already reported stays open until it is heard from.
SILENT_HORIZON = timedelta(days=7)
ACCEPTANCE_WINDOW = timedelta(hours=1)
#: Judged groups in the window below which the acceptance share says nothing either way.
MIN_JUDGED = 4
_LOCK_KEY = 0x5A90_A1E7  # pg advisory lock id of the alerts check


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
        outgoing = messages_reserve(messages, prefs_by_user, now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_LOCK_KEY])
    sent, capped, failed = messages_send(outgoing)
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
