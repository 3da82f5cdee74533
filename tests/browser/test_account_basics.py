"""In a real browser: the account basics. Password reset by email end to end (ask, read the email,
follow the link, set a new password, log in with it); sign-up with an address confirmed from its
emailed link; downloading one's data and deleting the account.

The site runs in a server process of its own (tests/conftest.py), so Django's in-memory email backend
would keep its outbox there; these tests give that server Django's file backend instead and read the
emails from its folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.utils import timezone
from factories import DEFAULT_PASSWORD, make_node_with_token, make_user
from playwright.sync_api import expect

from accounts.models import User
from nodes.models import Node

pytestmark = pytest.mark.django_db(transaction=True)

NEW_PASSWORD = "tidal-lantern-orchard-52"


@pytest.fixture(scope="module")
def mail_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("emails")


@pytest.fixture(scope="module")
def site(asgi_server, mail_dir):
    """A live server whose emails are files in `mail_dir`."""
    email = {"EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend", "EMAIL_FILE_PATH": str(mail_dir)}
    with asgi_server(settings=email) as server:
        yield server


def emails_to(mail_dir: Path, address: str) -> list[str]:
    """Every email the site wrote to `address`, oldest first (the file backend: one file per connection)."""
    found = []
    for path in sorted(mail_dir.glob("*.log"), key=lambda p: p.stat().st_mtime):
        for message in path.read_text().split("-" * 79):
            if re.search(rf"^To: {re.escape(address)}$", message, re.MULTILINE):
                found.append(message)
    return found


def link_in(message: str) -> str:
    return re.search(r"https?://\S+", message).group(0)


def log_in(page, base: str, username: str, password: str) -> None:
    page.goto(base + "/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()


def test_a_forgotten_password_is_reset_by_email(site, mail_dir, page, screenshot):
    make_user(username="ada", email="ada@example.org", email_confirmed_at=timezone.now())

    page.goto(site.url + "/accounts/login/")
    page.get_by_role("link", name="Forgot your password?").click()
    page.get_by_label("Email").fill("ada@example.org")
    page.get_by_role("button", name="Send the link").click()
    expect(page.get_by_role("heading", name="Check your email")).to_be_visible()

    (message,) = emails_to(mail_dir, "ada@example.org")
    assert "Reset your password" in message
    page.goto(link_in(message))
    page.get_by_label("New password:", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password confirmation").fill(NEW_PASSWORD)
    screenshot(page, "password-reset-new")
    page.get_by_role("button", name="Set the new password").click()
    expect(page.get_by_role("heading", name="Password set")).to_be_visible()

    log_in(page, site.url, "ada", NEW_PASSWORD)
    expect(page.get_by_role("button", name="Log out")).to_be_visible()

    page.goto(link_in(message))  # a second time: used up
    expect(page.locator("#reset-link-invalid")).to_be_visible()


def test_sign_up_with_an_email_confirmed_by_its_link(site, mail_dir, page, browser, screenshot):
    page.goto(site.url + "/accounts/signup/")
    page.get_by_label("Username").fill("grace")
    page.get_by_label("Display name").fill("Grace")
    page.get_by_label("Email (optional)").fill("grace@example.org")
    page.locator("#id_password1").fill(NEW_PASSWORD)
    page.locator("#id_password2").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Create account").click()
    messages = page.get_by_role("status")
    expect(messages).to_contain_text("Welcome, Grace. Next: add a node below.")
    expect(messages).to_contain_text("A confirmation link was sent to grace@example.org")
    expect(page.locator("#account-email-unconfirmed")).to_have_text("Not confirmed")
    screenshot(page, "signup-next-step")

    (message,) = emails_to(mail_dir, "grace@example.org")
    mailbox = browser.new_context().new_page()  # the address's owner, not logged in
    mailbox.goto(link_in(message))
    expect(mailbox.get_by_role("heading", name="Use grace@example.org for this account?")).to_be_visible()
    mailbox.get_by_role("button", name="Confirm this address").click()
    expect(mailbox.locator("#confirm-done")).to_contain_text("Confirmed: grace@example.org")
    mailbox.context.close()

    page.reload()
    expect(page.locator("#account-email-confirmed")).to_have_text("Confirmed")
    page.get_by_label("Email alerts").check()
    page.get_by_role("button", name="Save alerts").click()
    expect(page.locator("#alert-email-help")).to_contain_text("To grace@example.org, your account's address.")


def test_download_my_data_then_delete_my_account(site, page, screenshot):
    user = make_user(username="lin", display_name="Lin")
    node, token = make_node_with_token(owner=user, name="laptop")
    log_in(page, site.url, "lin", DEFAULT_PASSWORD)
    page.goto(site.url + "/me/#account")

    with page.expect_download() as download:
        page.locator("#account-data").click()
    data = json.loads(Path(download.value.path()).read_text())
    assert data["account"]["username"] == "lin" and [n["name"] for n in data["nodes"]] == ["laptop"]
    assert data["tokens"][0]["prefix"] == token[: len(data["tokens"][0]["prefix"])] and token not in json.dumps(data)

    page.get_by_label("Your password").fill("not my password")
    page.get_by_role("button", name="Delete my account").click()
    expect(page.get_by_role("status")).to_contain_text("That is not your password. Nothing was deleted.")
    page.get_by_label("Your password").fill(DEFAULT_PASSWORD)
    screenshot(page, "me-delete-account")
    page.get_by_role("button", name="Delete my account").click()
    expect(page.get_by_role("status")).to_contain_text("Your account is deleted")
    expect(page.get_by_role("link", name="Log in")).to_be_visible()

    assert Node.objects.get(id=node.id).retired_at is not None
    assert User.objects.get(id=user.id).username == f"deleted-{user.id}"
    log_in(page, site.url, "lin", DEFAULT_PASSWORD)
    expect(page.get_by_text("Please enter a correct username and password")).to_be_visible()
