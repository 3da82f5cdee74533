"""Alert email goes only to a confirmed address: a new address gets a signed, expiring link and
nothing else; the link's page confirms on a button (a GET changes nothing); a changed address must be
confirmed again; confirmation emails are limited per account and per address; an alert's subject
names the node by its id, never by the name its owner typed. Django's locmem email backend."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.core import mail, signing
from django.test import Client
from django.utils import timezone
from factories import make_node, make_node_token, make_user

from alerts.models import AlertSettings
from alerts.services import CONFIRM_MAX_AGE, CONFIRM_SALT, CONFIRMATIONS_PER_DAY, alerts_check, node_label
from nodes.models import Node
from pool.models import NodeVerdictCounts

pytestmark = pytest.mark.django_db


def _save(client: Client, email: str):
    data = {"email": email, "webhook_url": "", "silence_minutes": "5", "min_acceptance": "50"}
    return client.post("/me/alerts/", data, follow=True)


def _link(message) -> str:
    (url,) = re.findall(r"http://testserver(/alerts/confirm/[^/\s]+/)", message.body)
    return url


def _silent_node(user, name: str = "laptop") -> Node:
    node = make_node(owner=user, name=name)
    make_node_token(node=node)
    NodeVerdictCounts.objects.create(node=node, accepted_groups=1)
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now() - timedelta(minutes=20))
    return node


def test_alerts_go_to_an_address_only_once_its_link_is_followed(auth_client, user):
    page = _save(auth_client, "ada@example.org").content.decode()
    assert "A confirmation link was sent to ada@example.org" in page
    (confirmation,) = mail.outbox
    assert confirmation.to == ["ada@example.org"] and confirmation.subject == "[SAPO Swarm] Confirm alert emails"
    assert user.username not in confirmation.body and user.display_name not in confirmation.body
    node = _silent_node(user)

    assert alerts_check().sent == 0 and len(mail.outbox) == 1  # unconfirmed: nothing but the link
    assert "Not confirmed" in auth_client.get("/me/").content.decode()

    stranger = Client()  # the mailbox's owner, not logged in
    shown = stranger.get(_link(confirmation))
    assert shown.status_code == 200 and "Send node alerts to ada@example.org?" in shown.content.decode()
    assert AlertSettings.objects.get(user=user).email_confirmed_at is None  # a GET confirms nothing
    done = stranger.post(_link(confirmation))
    assert done.status_code == 200 and "Confirmed" in done.content.decode()
    assert AlertSettings.objects.get(user=user).email_confirmed_at is not None

    assert alerts_check().sent == 1
    alert_email = mail.outbox[-1]
    assert alert_email.to == ["ada@example.org"] and alert_email.subject == f"[SAPO Swarm] node {node.id}: silent"


def test_a_changed_address_is_confirmed_again_and_the_old_link_stops_working(auth_client, user):
    _save(auth_client, "ada@example.org")
    first = _link(mail.outbox[0])
    Client().post(first)
    _save(auth_client, "ada@example.org")  # saved again unchanged: still confirmed, no new link
    assert AlertSettings.objects.get(user=user).email_confirmed_at is not None and len(mail.outbox) == 1

    _save(auth_client, "grace@example.org")
    row = AlertSettings.objects.get(user=user)
    assert row.email_confirmed_at is None and mail.outbox[-1].to == ["grace@example.org"]
    _silent_node(user)
    assert alerts_check().sent == 0 and len(mail.outbox) == 2
    stale = Client().post(first)  # the first link names the first address
    assert stale.status_code == 400 and "no longer set" in stale.content.decode()
    assert AlertSettings.objects.get(user=user).email_confirmed_at is None


class _SignedEarlier(signing.TimestampSigner):
    """Signs as if at `seconds` ago: a link made that long before it is followed."""

    seconds = 0

    def timestamp(self) -> str:
        return signing.b62_encode(int(time.time()) - self.seconds)


@pytest.mark.parametrize(("age", "status"), [(CONFIRM_MAX_AGE - timedelta(minutes=5), 200), (CONFIRM_MAX_AGE, 400)])
def test_a_link_expires(auth_client, user, age, status):
    _save(auth_client, "ada@example.org")
    signer = _SignedEarlier(salt=CONFIRM_SALT)
    signer.seconds = int(age.total_seconds()) + 1
    token = signer.sign_object({"u": user.pk, "e": "ada@example.org"}, compress=True)
    answer = Client().post(f"/alerts/confirm/{token}/")
    assert answer.status_code == status
    assert (AlertSettings.objects.get(user=user).email_confirmed_at is not None) == (status == 200)
    if status == 400:
        assert "expired" in answer.content.decode()


@pytest.mark.parametrize("token", ["nonsense", signing.dumps({"u": 1, "e": "x@example.org"}, salt="another")])
def test_a_forged_link_confirms_nothing(auth_client, user, token):
    _save(auth_client, "ada@example.org")
    answer = Client().post(f"/alerts/confirm/{token}/")
    assert answer.status_code == 400 and "not valid" in answer.content.decode()
    assert AlertSettings.objects.get(user=user).email_confirmed_at is None


def test_confirmation_emails_are_limited_per_account(auth_client, user):
    _save(auth_client, "ada@example.org")
    for _ in range(CONFIRMATIONS_PER_DAY - 1):
        page = auth_client.post("/me/alerts/confirmation/", follow=True).content.decode()
        assert "A new confirmation link was sent" in page
    page = auth_client.post("/me/alerts/confirmation/", follow=True).content.decode()
    assert f"At most {CONFIRMATIONS_PER_DAY} confirmation emails a day" in page
    page = _save(auth_client, "other@example.org").content.decode()  # another address: the account's limit holds
    assert "other@example.org is not confirmed" in page
    assert len(mail.outbox) == CONFIRMATIONS_PER_DAY


def test_confirmation_emails_are_limited_per_address_whatever_account_asks(client):
    for i in range(CONFIRMATIONS_PER_DAY + 2):
        client.force_login(make_user(username=f"sender{i}"))
        _save(client, "Victim@Example.org" if i % 2 else "victim@example.org")
    assert len(mail.outbox) == CONFIRMATIONS_PER_DAY


def test_the_subject_carries_no_free_text(user):
    AlertSettings.objects.create(
        user=user, email="ada@example.org", email_confirmed_at=timezone.now(), silence_minutes=5
    )
    node = _silent_node(user, name="Cheap pills at spam example dot org call now " + "x" * 10)
    alerts_check()
    (message,) = mail.outbox
    assert message.subject == f"[SAPO Swarm] node {node.id}: silent" and "pills" not in message.subject
    assert f"Your node {node.id} (Cheap pills at spam example dot org cal…)" in message.body


def test_node_label_keeps_printable_characters_only():
    assert node_label(Node(name="gpu\u202ebox\u200b one")) == "gpubox one"
    assert len(node_label(Node(name="n" * 100))) == 40
