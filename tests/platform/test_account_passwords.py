"""Password reset by email, password change and the password help (accounts.views, accounts.forms)."""

import re

import pytest
from django.core import mail
from django.utils import timezone
from factories import DEFAULT_PASSWORD, make_user

from accounts import limits
from accounts.forms import ChangePasswordForm, NewPasswordForm, SignupForm

pytestmark = pytest.mark.django_db

RESET = "/accounts/password_reset/"
RESET_DONE = "/accounts/password_reset/done/"
NEW_PASSWORD = "tidal-lantern-orchard-52"


def _confirmed(**fields):
    return make_user(email="ada@example.org", email_confirmed_at=timezone.now(), **fields)


def _link(message) -> str:
    return re.search(r"https?://\S+", message.body).group(0)


class TestPasswordHelp:
    @pytest.mark.parametrize(
        "help_text",
        [
            SignupForm().fields["password1"].help_text,
            NewPasswordForm(None).fields["new_password1"].help_text,
            ChangePasswordForm(None).fields["new_password1"].help_text,
        ],
    )
    def test_leads_with_length_common_and_digits_and_ends_with_the_maximum(self, help_text):
        items = re.findall(r"<li>(.*?)</li>", help_text)
        assert "at least 8 characters" in items[0]
        assert "commonly used" in items[1] and "entirely numeric" in items[2]
        assert "4096" in items[-1]


class TestPasswordReset:
    def test_login_page_links_to_it(self, client):
        assert b'href="/accounts/password_reset/"' in client.get("/accounts/login/").content

    def test_a_confirmed_address_gets_a_link_that_sets_a_new_password_once(self, client):
        user = _confirmed()
        response = client.post(RESET, {"email": "ADA@example.org"})
        assert response.status_code == 302 and response["Location"] == RESET_DONE
        assert len(mail.outbox) == 1 and mail.outbox[0].to == ["ada@example.org"]
        link = _link(mail.outbox[0])
        form_page = client.get(link, follow=True)
        assert form_page.context["validlink"]
        done = client.post(
            form_page.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
        )
        assert done.status_code == 302
        user.refresh_from_db()
        assert user.check_password(NEW_PASSWORD)
        assert not client.get(link, follow=True).context["validlink"]  # used: the password it hashed changed

    @pytest.mark.parametrize("email", ["nobody@example.org", "unconfirmed@example.org"])
    def test_an_unknown_or_unconfirmed_address_gets_the_same_answer_and_no_email(self, client, email):
        make_user(email="unconfirmed@example.org")
        response = client.post(RESET, {"email": email})
        assert response.status_code == 302 and response["Location"] == RESET_DONE
        assert mail.outbox == []

    def test_one_address_gets_at_most_three_links_a_day_and_the_same_answer_past_them(self, client):
        _confirmed()
        for _ in range(limits.PASSWORD_RESETS_PER_ADDRESS_PER_DAY + 1):
            response = client.post(RESET, {"email": "ada@example.org"})
            assert response.status_code == 302 and response["Location"] == RESET_DONE
        assert len(mail.outbox) == limits.PASSWORD_RESETS_PER_ADDRESS_PER_DAY

    def test_one_network_is_refused_429_past_its_hourly_limit(self, client):
        for n in range(limits.PASSWORD_RESETS_PER_NETWORK_PER_HOUR):
            assert client.post(RESET, {"email": f"x{n}@example.org"}).status_code == 302
        response = client.post(RESET, {"email": "last@example.org"})
        assert response.status_code == 429
        assert "password-reset requests" in response.content.decode()

    def test_a_bad_address_is_a_form_error(self, client):
        response = client.post(RESET, {"email": "not an address"})
        assert response.status_code == 200 and response.context["form"].errors["email"]
        assert mail.outbox == []


class TestPasswordChange:
    def test_a_logged_in_contributor_changes_the_password(self, client):
        user = make_user()
        client.force_login(user)
        response = client.post(
            "/accounts/password/",
            {"old_password": DEFAULT_PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
        )
        assert response.status_code == 302 and response["Location"] == "/accounts/password/done/"
        user.refresh_from_db()
        assert user.check_password(NEW_PASSWORD)


class TestSignupNextStep:
    def test_sign_up_lands_on_my_page_with_the_next_step(self, client):
        data = {"username": "dana", "display_name": "Dana R.", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
        response = client.post("/accounts/signup/", data, follow=True)
        assert response.redirect_chain[-1][0] == "/me/#add-node-title"
        text = response.content.decode()
        assert "Welcome, Dana R." in text and '<a href="/me/#add-node-title">add a node</a>' in text
