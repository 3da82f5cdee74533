import pytest
from django.contrib.auth import get_user_model
from factories import DEFAULT_PASSWORD, make_user

from accounts.services import user_create
from common.errors import ApplicationError

pytestmark = pytest.mark.django_db
User = get_user_model()

SIGNUP = "/accounts/signup/"
LOGIN = "/accounts/login/"
LOGOUT = "/accounts/logout/"
PASSWORD_CHANGE = "/accounts/password/"


def signup_data(**overrides) -> dict:
    data = {
        "username": "dana",
        "display_name": "Dana R.",
        "password1": "plenty-of-entropy-17",
        "password2": "plenty-of-entropy-17",
    }
    data.update(overrides)
    return data


class TestUserCreate:
    def test_creates_a_user_with_a_hashed_password(self):
        user = user_create(username="erin", display_name="Erin", password="plenty-of-entropy-17")
        assert user.check_password("plenty-of-entropy-17")
        assert user.password != "plenty-of-entropy-17"
        assert user.public_name == "Erin"

    def test_display_names_are_unique_case_insensitively(self):
        make_user(username="erin", display_name="Erin")
        with pytest.raises(ApplicationError) as info:
            user_create(username="erin2", display_name="ERIN", password="plenty-of-entropy-17")
        assert info.value.code == "display_name_taken"

    def test_weak_password_is_refused(self):
        with pytest.raises(ApplicationError) as info:
            user_create(username="erin", display_name="Erin", password="123")
        assert info.value.code == "invalid_password"

    def test_no_password_means_unusable(self):
        assert not user_create(username="bot", display_name="Bot", password=None).has_usable_password()


class TestSignup:
    def test_page_renders(self, client):
        response = client.get(SIGNUP)
        assert response.status_code == 200
        assert b'name="display_name"' in response.content

    def test_sign_up_logs_the_contributor_in(self, client):
        response = client.post(SIGNUP, signup_data())

        assert response.status_code == 302
        user = User.objects.get(username="dana")
        assert user.display_name == "Dana R."
        assert client.session["_auth_user_id"] == str(user.id)

    @pytest.mark.parametrize(
        ("overrides", "field"),
        [
            ({"password2": "something-else-entirely"}, "password2"),
            ({"password1": "short", "password2": "short"}, "password1"),
            ({"display_name": "   "}, "display_name"),
            ({"username": "no spaces allowed"}, "username"),
        ],
    )
    def test_invalid_sign_up_shows_errors_and_creates_nothing(self, client, overrides, field):
        response = client.post(SIGNUP, signup_data(**overrides))

        assert response.status_code == 400
        assert response.context["form"].errors[field]
        assert not User.objects.filter(username=signup_data(**overrides)["username"]).exists()

    def test_taken_username_and_display_name(self, client):
        make_user(username="dana", display_name="Someone")
        make_user(username="other", display_name="dana r.")
        response = client.post(SIGNUP, signup_data())
        errors = response.context["form"].errors
        assert "username" in errors and "display_name" in errors


class TestPasswordLikeTheAccount:
    """A password equal or close to the display name or the username is refused (the display name is
    public: anyone could try it)."""

    @pytest.mark.parametrize("password", ["Moonlit Harbour Keeper", "moonlit-harbour-keeper", "MoonlitHarbourKeeper1"])
    def test_sign_up_refuses_a_password_like_the_display_name(self, client, password):
        data = signup_data(display_name="Moonlit Harbour Keeper", password1=password, password2=password)
        response = client.post(SIGNUP, data)
        assert response.status_code == 400
        assert "too similar to the display name" in " ".join(response.context["form"].errors["password1"])
        assert not User.objects.filter(username="dana").exists()

    def test_sign_up_refuses_a_password_like_the_username(self, client):
        data = signup_data(username="harbourkeeper77", password1="harbourkeeper77!", password2="harbourkeeper77!")
        response = client.post(SIGNUP, data)
        assert response.status_code == 400
        assert "too similar to the username" in " ".join(response.context["form"].errors["password1"])

    def test_user_create_refuses_it_too(self):
        with pytest.raises(ApplicationError) as info:
            user_create(username="zed", display_name="Moonlit Harbour Keeper", password="Moonlit Harbour Keeper")
        assert info.value.code == "invalid_password" and "display name" in info.value.message
        assert not User.objects.filter(username="zed").exists()

    def test_password_change_refuses_the_display_name(self, client):
        user = make_user(username="zed", display_name="Moonlit Harbour Keeper")
        client.force_login(user)
        new = "moonlit harbour keeper"
        response = client.post(
            PASSWORD_CHANGE, {"old_password": DEFAULT_PASSWORD, "new_password1": new, "new_password2": new}
        )
        assert response.status_code == 200 and "too similar to the display name" in response.content.decode()
        user.refresh_from_db()
        assert user.check_password(DEFAULT_PASSWORD)


class TestLoginLogout:
    def test_login_and_logout(self, client, user):
        page = client.get(LOGIN)
        assert page.status_code == 200

        response = client.post(LOGIN, {"username": "alice", "password": DEFAULT_PASSWORD})
        assert response.status_code == 302
        assert client.session["_auth_user_id"] == str(user.id)

        response = client.post(LOGOUT)
        assert response.status_code == 302
        assert "_auth_user_id" not in client.session

    def test_wrong_password(self, client, user):
        response = client.post(LOGIN, {"username": "alice", "password": "nope"})
        assert response.status_code == 200
        assert "_auth_user_id" not in client.session

    def test_logged_in_nav_offers_logout(self, auth_client):
        response = auth_client.get(PASSWORD_CHANGE)
        assert b"Log out" in response.content and b"Alice" in response.content


class TestPasswordChange:
    def test_requires_login(self, client):
        response = client.get(PASSWORD_CHANGE)
        assert response.status_code == 302
        assert response["Location"].startswith(LOGIN)

    def test_change_password(self, auth_client, user):
        response = auth_client.post(
            PASSWORD_CHANGE,
            {
                "old_password": DEFAULT_PASSWORD,
                "new_password1": "new-long-phrase-99",
                "new_password2": "new-long-phrase-99",
            },
        )
        assert response.status_code == 302
        user.refresh_from_db()
        assert user.check_password("new-long-phrase-99")
        assert auth_client.get(response["Location"]).status_code == 200

    def test_wrong_old_password(self, auth_client, user):
        response = auth_client.post(
            PASSWORD_CHANGE,
            {"old_password": "wrong", "new_password1": "new-long-phrase-99", "new_password2": "new-long-phrase-99"},
        )
        assert response.status_code == 200
        user.refresh_from_db()
        assert user.check_password(DEFAULT_PASSWORD)


def test_admin_pages_for_accounts_and_nodes(client, node):
    admin = make_user(username="root", display_name="Root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    for url in [
        "/admin/accounts/user/",
        "/admin/accounts/user/add/",
        "/admin/nodes/node/",
        f"/admin/nodes/node/{node.id}/change/",
        "/admin/nodes/nodetoken/",
    ]:
        assert client.get(url).status_code == 200, url


class TestPasswordLength:
    """At most 4,096 characters (accounts.passwords): hashing one costs CPU in proportion to its length."""

    def test_sign_up_refuses_a_password_over_the_maximum(self, client):
        long = "correct horse battery staple " * 3500  # 101,500 characters
        response = client.post(SIGNUP, signup_data(password1=long, password2=long))
        assert response.status_code == 400
        assert "at most 4096 characters" in " ".join(response.context["form"].errors["password1"])
        assert not User.objects.filter(username="dana").exists()

    def test_a_password_of_the_maximum_length_is_taken(self, client):
        longest = ("correct horse battery staple " * 142)[:4096]
        response = client.post(SIGNUP, signup_data(password1=longest, password2=longest))
        assert response.status_code == 302
        assert User.objects.get(username="dana").check_password(longest)

    def test_the_validator_refuses_it_wherever_passwords_are_set(self):
        with pytest.raises(ApplicationError) as info:
            user_create(username="erin", display_name="Erin", password="x1!" * 2000)
        assert info.value.code == "invalid_password"

    def test_log_in_refuses_an_overlong_password_without_hashing_it(self, client, monkeypatch):
        from django.contrib.auth import base_user

        make_user(username="erin", display_name="Erin")
        hashed = []
        for name in ("make_password", "check_password"):
            real = getattr(base_user, name)  # what User.check_password and set_password call
            monkeypatch.setattr(base_user, name, lambda *a, _real=real, **k: hashed.append(len(a[0])) or _real(*a, **k))
        response = client.post(LOGIN, {"username": "erin", "password": "x" * 1_000_000})
        assert response.status_code == 200 and "_auth_user_id" not in client.session
        assert hashed == []  # refused before any hashing
        client.post(LOGIN, {"username": "erin", "password": "not-the-password-1"})
        assert hashed  # a wrong password of a sane length is hashed, as before
