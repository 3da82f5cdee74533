"""An account as a whole (web.account): its data as JSON from /me/, and its deletion with the password,
which retires its nodes, ends its team membership, erases its address and alerts, frees its names and
keeps its groups in the pool as "anonymous"."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone
from factories import DEFAULT_PASSWORD, make_node, make_node_token, make_user

from accounts.models import ANONYMOUS, User
from alerts.models import Alert, AlertSettings, Condition
from community.models import Membership, Team
from community.services import team_found, team_join
from nodes.models import NodeToken, SocketOrder
from web import account

pytestmark = pytest.mark.django_db

DATA = "/me/data.json"
DELETE = "/me/delete/"


@pytest.fixture
def ada():
    user = make_user(username="ada", display_name="Ada L.", email="ada@example.org", email_confirmed_at=timezone.now())
    AlertSettings.objects.create(user=user, email_alerts=True, webhook_url="https://example.org/hook")
    return user


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


class TestData:
    def test_the_download_holds_the_account_its_nodes_token_prefixes_teams_and_alert_settings(self, ada):
        node = make_node(owner=ada, name="laptop")
        token, plaintext = make_node_token(node=node)
        team = team_found(founder=ada, name="Lovelace Lab", address="192.0.2.1")
        response = _client(ada).get(DATA)
        assert response.status_code == 200 and response["Content-Type"].startswith("application/json")
        assert "attachment" in response["Content-Disposition"] and "no-cache" in response["Cache-Control"]
        body = response.content.decode()
        assert plaintext not in body and token.token_hash not in body  # prefixes only, never a secret
        data = json.loads(body)
        assert data["account"]["username"] == "ada" and data["account"]["email"] == "ada@example.org"
        assert [n["name"] for n in data["nodes"]] == ["laptop"] and data["nodes"][0]["accepted"] == 0
        assert data["tokens"] == [
            {
                "node_id": node.id,
                "prefix": token.prefix,
                "created_at": token.created_at.isoformat(),
                "last_used_at": None,
                "revoked_at": None,
            }
        ]
        assert data["teams"][0]["slug"] == team.slug and data["teams"][0]["founder"]
        assert data["alert_settings"]["email_alerts"] and data["totals"]["accepted"] == 0
        assert data["truncated"] == []

    def test_lists_are_bounded(self, ada, monkeypatch):
        monkeypatch.setattr(account, "EXPORT_LIST_LIMIT", 2)
        for n in range(3):
            make_node_token(node=make_node(owner=ada, name=f"n{n}"))
        data = account.account_data(user=ada)
        assert [n["name"] for n in data["nodes"]] == ["n2", "n1"] and len(data["tokens"]) == 2
        assert data["truncated"] == ["nodes", "tokens"]

    def test_it_needs_a_login_and_shows_only_ones_own(self, ada, client):
        assert client.get(DATA).status_code == 302
        make_node(owner=ada, name="laptop")
        other = make_user()
        assert json.loads(_client(other).get(DATA).content)["nodes"] == []


class TestDelete:
    def test_a_wrong_password_deletes_nothing(self, ada):
        node = make_node(owner=ada, name="laptop")
        page = _client(ada).post(DELETE, {"password": "not-it"}, follow=True).content.decode()
        assert "That is not your password. Nothing was deleted." in page
        ada.refresh_from_db()
        assert ada.is_active and ada.deleted_at is None and ada.username == "ada"
        node.refresh_from_db()
        assert node.retired_at is None

    def test_deletion_retires_nodes_hands_the_team_on_and_frees_the_names(self, ada):
        node = make_node(owner=ada, name="laptop")
        make_node_token(node=node)
        Alert.objects.create(user=ada, node=node, condition=Condition.SILENT, detail="quiet")
        team = team_found(founder=ada, name="Lovelace Lab", address="192.0.2.1")
        bob = make_user(username="bob")
        team_join(user=bob, team=team)
        client = _client(ada)

        response = client.post(DELETE, {"password": DEFAULT_PASSWORD}, follow=True)
        assert response.redirect_chain[-1][0] == "/"
        assert "Your account is deleted" in response.content.decode()
        assert client.get("/me/").status_code == 302  # logged out

        ada.refresh_from_db()
        assert ada.deleted_at is not None and not ada.is_active and not ada.has_usable_password()
        assert (ada.username, ada.display_name, ada.email, ada.public_name) == (f"deleted-{ada.id}", "", "", ANONYMOUS)
        node.refresh_from_db()
        assert node.retired_at is not None and not NodeToken.objects.filter(node=node, revoked_at=None).exists()
        assert SocketOrder.objects.filter(event__node_id=node.id).exists()  # its open sockets are told to close
        assert not Membership.objects.filter(user=ada, left_at=None).exists()
        assert Team.objects.get(id=team.id).founder_id == bob.id
        assert not AlertSettings.objects.filter(user=ada).exists() and not Alert.objects.filter(user=ada).exists()

        signup = {
            "username": "ada",
            "display_name": "Ada L.",
            "password1": "x-fresh-pass-91",
            "password2": "x-fresh-pass-91",
        }
        assert Client().post("/accounts/signup/", signup).status_code == 302  # both names are free again
        assert not Client().login(username=f"deleted-{ada.id}", password=DEFAULT_PASSWORD)

    def test_a_team_whose_founder_was_its_only_member_is_disbanded(self, ada):
        team = team_found(founder=ada, name="Solo", address="192.0.2.1")
        account.account_delete(user=ada)
        assert Team.objects.get(id=team.id).disbanded_at is not None

    def test_the_deleted_username_cannot_be_taken_at_sign_up(self):
        data = {
            "username": "deleted-7",
            "display_name": "X",
            "password1": "x-fresh-pass-91",
            "password2": "x-fresh-pass-91",
        }
        response = Client().post("/accounts/signup/", data)
        assert response.status_code == 400 and "kept for deleted accounts" in response.content.decode()
        assert not User.objects.filter(username="deleted-7").exists()

    def test_it_needs_a_login_and_a_post(self, ada, client):
        assert client.post(DELETE, {"password": DEFAULT_PASSWORD}).status_code == 302
        assert _client(ada).get(DELETE).status_code == 405
        assert User.objects.get(id=ada.id).deleted_at is None

    def test_staff_see_a_deleted_account_as_deleted_in_the_admin(self, ada):
        account.account_delete(user=ada)
        staff = make_user(username="root", display_name="Root", is_staff=True, is_superuser=True)
        client = _client(staff)
        listing = client.get("/admin/accounts/user/?deleted_at__isnull=False").content.decode()
        assert f"deleted-{ada.id}" in listing and "root" not in listing.split("result_list")[-1]
        change = client.get(f"/admin/accounts/user/{ada.id}/change/")
        assert change.status_code == 200 and 'name="deleted_at_0"' in change.content.decode()
