"""Every way an account is named (sign-up, the admin's add and change forms, createsuperuser) runs the
same checks (accounts.services.user_names_set) and writes the same look-alike fingerprints."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from factories import make_user

from accounts.models import User
from accounts.services import user_create
from common import names
from common.errors import ApplicationError

pytestmark = pytest.mark.django_db

ADD = "/admin/accounts/user/add/"
CYRILLIC_SAM = "\u0405am"  # Cyrillic Ѕ


@pytest.fixture
def admin_client(client):
    root = make_user(username="root", display_name="Root", is_staff=True, is_superuser=True)
    client.force_login(root)
    return client


def _add(admin_client, **fields):
    data = {
        "username": "newcomer",
        "display_name": "Newcomer",
        "password1": "",
        "password2": "",
        "usable_password": "false",
    }
    data.update(fields)
    return admin_client.post(ADD, data)


def _change(admin_client, user: User, **fields):
    data = {
        "username": user.username,
        "display_name": user.display_name,
        "email": user.email,
        "is_active": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }
    data.update(fields)
    return admin_client.post(f"/admin/accounts/user/{user.id}/change/", data)


REFUSED = [
    pytest.param({"display_name": CYRILLIC_SAM}, "display_name", id="display-name-imitating-a-username"),
    pytest.param({"display_name": "Sam\u200b"}, "display_name", id="zero-width"),
    pytest.param({"display_name": "\u202eSam"}, "display_name", id="right-to-left-override"),
    pytest.param({"display_name": "Anonymous"}, "display_name", id="anonymous"),
    pytest.param({"display_name": "\u3164"}, "display_name", id="blank-hangul-filler"),
    pytest.param({"display_name": ""}, "display_name", id="empty"),
    pytest.param({"display_name": "Root"}, "display_name", id="the-admin's-own-name"),
    pytest.param({"username": "anonymous"}, "username", id="username-anonymous"),
    pytest.param({"username": "\u0405am"}, "username", id="username-cyrillic-look-alike-of-a-username"),
    pytest.param({"username": "Sarn"}, "username", id="username-rn-for-m"),
    pytest.param(
        {"username": "\u0441\u0430\u0440\u0435"}, "username", id="username-all-cyrillic-reads-as-display-name"
    ),
]


@pytest.mark.parametrize(("fields", "field"), REFUSED)
def test_the_admin_add_form_refuses(admin_client, fields, field):
    make_user(username="Sam", display_name="Sam")
    make_user(username="carter", display_name="cape")
    response = _add(admin_client, **fields)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors.get(field), response.context["adminform"].form.errors
    assert not User.objects.filter(username__in=["newcomer", fields.get("username")]).exists()


@pytest.mark.parametrize(("fields", "field"), REFUSED)
def test_the_admin_change_form_refuses(admin_client, fields, field):
    make_user(username="Sam", display_name="Sam")
    make_user(username="carter", display_name="cape")
    user = make_user(username="newcomer", display_name="Newcomer")
    response = _change(admin_client, user, **fields)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors.get(field), response.context["adminform"].form.errors
    user.refresh_from_db()
    assert (user.username, user.display_name) == ("newcomer", "Newcomer")


def test_the_admin_forms_write_the_fingerprints(admin_client):
    response = _add(admin_client, username="Sam", display_name="Sam  Stone")
    assert response.status_code == 302, response.context["adminform"].form.errors
    user = User.objects.get(username="Sam")
    assert user.display_name == "Sam Stone"  # whitespace collapsed as at sign-up
    assert (user.username_skeleton, user.display_name_skeleton) == (names.skeleton("Sam"), names.skeleton("Sam Stone"))
    response = _change(admin_client, user, display_name="Samuel")
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.display_name_skeleton == names.skeleton("Samuel")
    with pytest.raises(ApplicationError) as info:
        user_create(username="dana", display_name="\uff33amuel", password=None)  # fullwidth S
    assert info.value.code == "display_name_taken"


def test_the_admin_change_form_saves_other_fields_of_an_account_whatever_its_name(admin_client):
    user = make_user(username="legacy", display_name="Legacy")
    User.objects.filter(id=user.id).update(display_name="anonymous")  # stored before the checks
    user.refresh_from_db()
    response = _change(admin_client, user, email="legacy@example.org")
    assert response.status_code == 302
    user.refresh_from_db()
    assert user.email == "legacy@example.org"


def _createsuperuser(monkeypatch, **env) -> None:
    for key, value in env.items():
        monkeypatch.setenv(f"DJANGO_SUPERUSER_{key.upper()}", value)
    call_command("createsuperuser", interactive=False, verbosity=0)


def test_createsuperuser_refuses_a_look_alike_username(monkeypatch):
    make_user(username="sam", display_name="Sam")
    with pytest.raises(CommandError, match="username_taken"):
        _createsuperuser(
            monkeypatch, username="Sarn", email="s@example.org", display_name="Boss", password="x-long-pass-91"
        )
    assert not User.objects.filter(is_superuser=True).exists()


def test_createsuperuser_refuses_a_look_alike_display_name(monkeypatch):
    make_user(username="sam", display_name="Sam")
    with pytest.raises(CommandError, match="display_name_taken"):
        _createsuperuser(
            monkeypatch, username="boss", email="b@example.org", display_name="\uff33am", password="x-long-pass-91"
        )
    assert not User.objects.filter(username="boss").exists()


def test_createsuperuser_refuses_a_reserved_display_name(monkeypatch):
    with pytest.raises(CommandError, match="display_name_reserved"):
        _createsuperuser(
            monkeypatch, username="boss", email="b@example.org", display_name="ANONYM0US", password="x-long-pass-91"
        )
    assert not User.objects.filter(username="boss").exists()


def test_a_sign_up_imitating_an_account_made_by_createsuperuser_is_refused(client, monkeypatch):
    _createsuperuser(
        monkeypatch, username="Sam", email="sam@example.org", display_name="Sam Staff", password="x-long-pass-91"
    )
    for display_name, username in [("\uff33am", "imitator1"), ("\uff33am Staff", "imitator2"), ("Nobody", "\u0405am")]:
        response = client.post(
            "/accounts/signup/",
            {
                "username": username,
                "display_name": display_name,
                "password1": "plenty-of-entropy-17",
                "password2": "plenty-of-entropy-17",
            },
        )
        assert response.status_code == 400, (display_name, username)
        assert not User.objects.filter(username=username).exists()
    staff = User.objects.get(username="Sam")
    assert staff.is_superuser and staff.username_skeleton == names.skeleton("Sam")
    assert staff.display_name_skeleton == names.skeleton("Sam Staff")


class TestUsernames:
    def test_a_username_that_reads_as_another_accounts_name_is_taken(self):
        make_user(username="alice", display_name="Builder")
        for username in ["AIice", "a1ice", "BuiIder"]:
            with pytest.raises(ApplicationError) as info:
                user_create(username=username, display_name=f"Someone {username}", password=None)
            assert info.value.code in {"username_taken", "invalid_username"}, username
        with pytest.raises(ApplicationError) as info:
            user_create(username="bob", display_name="ALICE", password=None)
        assert info.value.code == "display_name_taken"

    def test_a_username_of_mixed_scripts_or_reserved_is_refused(self):
        for username, code in [("\u0430lice", "invalid_username"), ("an0nymous", "username_reserved")]:
            with pytest.raises(ApplicationError) as info:
                user_create(username=username, display_name="Fine Name", password=None)
            assert info.value.code == code, username

    def test_an_account_may_use_its_own_username_as_display_name(self):
        user = user_create(username="erin", display_name="Erin", password=None)
        assert user.username_skeleton == names.skeleton("erin")
