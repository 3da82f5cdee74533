"""The account's one email address (accounts.addresses): optional at sign-up or set on /me/, used only
once confirmed by a signed, expiring link (the link's page confirms on a button; a GET changes
nothing); a changed address must be confirmed again; confirmation emails are limited per account, per
address from one network, and per address in all; alerts go to the confirmed address when turned on,
their subject naming the node by its id, never by the name its owner typed. Django's locmem backend."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.core import mail, signing
from django.test import Client
from django.utils import timezone
from factories import make_node, make_node_token, make_user

from accounts import limits
from accounts.addresses import CONFIRM_MAX_AGE, CONFIRM_SALT, user_email_set
from accounts.models import User
from alerts.check import alerts_check
from alerts.delivery import node_label
from alerts.models import AlertSettings
from common.errors import ApplicationError
from nodes.models import Node
from pool.models import NodeVerdictCounts

pytestmark = pytest.mark.django_db

PASSWORD = "tidal-lantern-orchard-52"


def _set(client: Client, email: str):
    return client.post("/accounts/email/", {"email": email}, follow=True)


def _alerts_on(client: Client):
    data = {"email_alerts": "on", "webhook_url": "", "silence_minutes": "5", "min_acceptance": "50"}
    return client.post("/me/alerts/", data, follow=True)


def _link(message) -> str:
    (url,) = re.findall(r"http://testserver(/accounts/email/confirm/[^/\s]+/)", message.body)
    return url


def _silent_node(user, name: str = "laptop") -> Node:
    node = make_node(owner=user, name=name)
    make_node_token(node=node)
    NodeVerdictCounts.objects.create(node=node, accepted_groups=1)
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now() - timedelta(minutes=20))
    return node


def _confirmed_at(user) -> object:
    return User.objects.get(id=user.id).email_confirmed_at


def test_sign_up_with_an_address_mails_its_link_and_the_page_confirms_it(client):
    data = {"username": "dana", "display_name": "Dana", "email": "dana@example.org"}
    page = client.post("/accounts/signup/", {**data, "password1": PASSWORD, "password2": PASSWORD}, follow=True)
    assert "A confirmation link was sent to dana@example.org" in page.content.decode()
    user = User.objects.get(username="dana")
    assert user.email == "dana@example.org" and user.email_confirmed_at is None
    (confirmation,) = mail.outbox
    assert confirmation.subject == "[SAPO Swarm] Confirm your email address"
    assert "dana" not in confirmation.body.lower()  # nothing from the account that asked
    stranger = Client()
    assert "Use dana@example.org for this account?" in stranger.get(_link(confirmation)).content.decode()
    assert _confirmed_at(user) is None  # a GET confirms nothing
    assert "Confirmed" in stranger.post(_link(confirmation)).content.decode()
    assert _confirmed_at(user) is not None


def test_sign_up_without_an_address_sends_nothing(client):
    data = {"username": "dana", "display_name": "Dana", "password1": PASSWORD, "password2": PASSWORD}
    client.post("/accounts/signup/", data)
    assert User.objects.get(username="dana").email == "" and mail.outbox == []


def test_a_bad_address_is_refused_and_nothing_stored(auth_client, user):
    data = {"username": "dana", "display_name": "Dana", "email": "nope", "password1": PASSWORD, "password2": PASSWORD}
    assert Client().post("/accounts/signup/", data).status_code == 400
    assert not User.objects.filter(username="dana").exists()
    assert "Enter a valid email address" in _set(auth_client, "a@b@c").content.decode()
    assert User.objects.get(id=user.id).email == ""
    with pytest.raises(ApplicationError) as info:
        user_email_set(user=user, email="x" * 250 + "@example.org", confirm_link=None, network="10.0.0.1")
    assert info.value.code == "email_invalid"


def test_alerts_go_to_the_account_address_only_once_its_link_is_followed(auth_client, user):
    page = _set(auth_client, "ada@example.org").content.decode()
    assert "A confirmation link was sent to ada@example.org" in page
    (confirmation,) = mail.outbox
    _alerts_on(auth_client)
    node = _silent_node(user)

    assert alerts_check().sent == 0 and len(mail.outbox) == 1  # unconfirmed: nothing but the link
    assert "Not confirmed" in auth_client.get("/me/").content.decode()

    Client().post(_link(confirmation))
    assert alerts_check().sent == 1
    alert_email = mail.outbox[-1]
    assert alert_email.to == ["ada@example.org"] and alert_email.subject == f"[SAPO Swarm] node {node.id}: silent"


def test_a_confirmed_address_gets_no_alerts_until_they_are_turned_on(user):
    User.objects.filter(id=user.id).update(email="ada@example.org", email_confirmed_at=timezone.now())
    AlertSettings.objects.create(user=user, silence_minutes=5)
    _silent_node(user)
    assert alerts_check().sent == 0 and mail.outbox == []


def test_a_changed_address_is_confirmed_again_and_the_old_link_stops_working(auth_client, user):
    _set(auth_client, "ada@example.org")
    first = _link(mail.outbox[0])
    Client().post(first)
    _set(auth_client, "ada@example.org")  # saved again unchanged: still confirmed, no new link
    assert _confirmed_at(user) is not None and len(mail.outbox) == 1

    _set(auth_client, "grace@example.org")
    assert _confirmed_at(user) is None and mail.outbox[-1].to == ["grace@example.org"]
    _alerts_on(auth_client)
    _silent_node(user)
    assert alerts_check().sent == 0 and len(mail.outbox) == 2
    stale = Client().post(first)  # the first link names the first address
    assert stale.status_code == 400 and "no longer set" in stale.content.decode()
    assert _confirmed_at(user) is None


class _SignedEarlier(signing.TimestampSigner):
    """Signs as if at `seconds` ago: a link made that long before it is followed."""

    seconds = 0

    def timestamp(self) -> str:
        return signing.b62_encode(int(time.time()) - self.seconds)


@pytest.mark.parametrize(("age", "status"), [(CONFIRM_MAX_AGE - timedelta(minutes=5), 200), (CONFIRM_MAX_AGE, 400)])
def test_a_link_expires(auth_client, user, age, status):
    _set(auth_client, "ada@example.org")
    signer = _SignedEarlier(salt=CONFIRM_SALT)
    signer.seconds = int(age.total_seconds()) + 1
    token = signer.sign_object({"u": user.pk, "e": "ada@example.org"}, compress=True)
    answer = Client().post(f"/accounts/email/confirm/{token}/")
    assert answer.status_code == status
    assert (_confirmed_at(user) is not None) == (status == 200)
    if status == 400:
        assert "expired" in answer.content.decode()


@pytest.mark.parametrize(
    "token",
    [
        "nonsense",
        signing.dumps({"u": 1, "e": "x@example.org"}, salt="another"),
        signing.dumps(["not", "a", "dict"], salt=CONFIRM_SALT),
    ],
)
def test_a_forged_link_confirms_nothing(auth_client, user, token):
    _set(auth_client, "ada@example.org")
    answer = Client().post(f"/accounts/email/confirm/{token}/")
    assert answer.status_code == 400
    assert _confirmed_at(user) is None


def test_confirmation_emails_are_limited_per_account(auth_client, user):
    _set(auth_client, "ada@example.org")
    for _ in range(limits.CONFIRMATIONS_PER_ACCOUNT_PER_DAY - 1):
        page = auth_client.post("/accounts/email/confirmation/", follow=True).content.decode()
        assert "A confirmation link was sent" in page
    page = auth_client.post("/accounts/email/confirmation/", follow=True).content.decode()
    assert f"At most {limits.CONFIRMATIONS_PER_ACCOUNT_PER_DAY} confirmation emails a day for one account" in page
    page = _set(auth_client, "other@example.org").content.decode()  # another address: the account's limit holds
    assert "other@example.org is not confirmed" in page
    assert len(mail.outbox) == limits.CONFIRMATIONS_PER_ACCOUNT_PER_DAY


def _accounts_ask(address: str, network: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        client = Client(REMOTE_ADDR=network)
        client.force_login(make_user(username=f"sender{i}"))
        _set(client, address)


def test_accounts_on_one_network_cannot_use_up_what_the_address_owner_may_get(client):
    per_network = limits.CONFIRMATIONS_PER_ADDRESS_PER_NETWORK_PER_DAY
    _accounts_ask("Victim@Example.org", "203.0.113.7", per_network + 2)
    assert len(mail.outbox) == per_network  # that network's share, whatever the spelling
    _accounts_ask("victim@example.org", "198.51.100.20", 1, start=100)  # the owner, from home
    assert len(mail.outbox) == per_network + 1


def test_an_address_gets_at_most_its_daily_limit_from_every_network_together(client):
    per_address = limits.CONFIRMATIONS_PER_ADDRESS_PER_DAY
    for n in range(per_address + 2):
        _accounts_ask("victim@example.org", f"192.0.2.{n + 1}", 1, start=n)
    assert len(mail.outbox) == per_address


def test_the_subject_carries_no_free_text(user):
    User.objects.filter(id=user.id).update(email="ada@example.org", email_confirmed_at=timezone.now())
    AlertSettings.objects.create(user=user, email_alerts=True, silence_minutes=5)
    node = _silent_node(user, name="Cheap pills at spam example dot org call now " + "x" * 10)
    alerts_check()
    (message,) = mail.outbox
    assert message.subject == f"[SAPO Swarm] node {node.id}: silent" and "pills" not in message.subject
    assert f"Your node {node.id} (Cheap pills at spam example dot org cal…)" in message.body


def test_node_label_keeps_printable_characters_only():
    assert node_label(Node(name="gpu\u202ebox\u200b one")) == "gpubox one"
    assert len(node_label(Node(name="n" * 100))) == 40
