"""The abuse limits (docs/moderation.md#limits) through the real pages and API: log-in lockout on the
site and the admin, sign-ups per address, nodes per account, token rotations, the API throttles, and
the counters beneath them in Redis and in PostgreSQL. Limits are the shipped defaults unless a test
lowers one to keep it short (then it says so)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from factories import DEFAULT_PASSWORD, make_node, make_user
from rest_framework.test import APIClient

from accounts import limits
from accounts.models import LimitCounter, User
from nodes.models import Node
from nodes.services import node_provision

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
ADMIN_LOGIN = "/admin/login/"
SIGNUP = "/accounts/signup/"
WRONG = "not-the-password-1"
LOCKED = "Too many failed log-ins"


def login(client: Client, username: str, password: str, url: str = LOGIN, **extra):
    return client.post(url, {"username": username, "password": password, "next": "/admin/"}, **extra)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


# --- the counters ---------------------------------------------------------------------------------


def test_a_counter_counts_within_its_window_then_starts_again(backend):
    assert limits.peek("t", "x") == limits.Count(0, 0)
    first = limits.hit("t", "x", window=1)
    assert first.count == 1 and first.retry_after == 1
    assert limits.hit("t", "x", window=60).count == 2  # a later hit does not move the window
    assert limits.peek("t", "x").count == 2 and limits.hit("t", "other", window=1).count == 1
    time.sleep(1.1)
    assert limits.peek("t", "x") == limits.Count(0, 0)
    assert limits.hit("t", "x", window=60) == limits.Count(1, 60)
    limits.clear("t", "x")
    assert limits.peek("t", "x").count == 0


def test_database_counters_are_swept_when_windows_close(settings):
    settings.REDIS_URL = ""
    limits.hit("t", "old", window=1)
    time.sleep(1.1)
    limits.hit("t", "new", window=60)  # opening a window sweeps the closed ones
    assert LimitCounter.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_hits_are_all_counted(backend):
    """Several server processes hit one counter: each hit gets its own count, none is lost (threads with
    their own connections stand in for the processes)."""
    counts: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(25):
                count = limits.hit("t", "shared", window=60).count
                with lock:
                    counts.append(count)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(counts) == list(range(1, 201))
    assert limits.peek("t", "shared").count == 200


def test_client_address(rf, settings):
    def address(remote: str, forwarded: str | None = None) -> str:
        extra = {"HTTP_X_FORWARDED_FOR": forwarded} if forwarded else {}
        return limits.client_address(rf.get("/", REMOTE_ADDR=remote, **extra))

    assert address("203.0.113.7") == "203.0.113.7"
    assert address("::ffff:203.0.113.7") == "203.0.113.7"
    # One subscriber's IPv6 block counts as one client.
    assert address("2001:db8:1:2::1") == address("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address("2001:db8:1:3::1") != address("2001:db8:1:2::1")
    # X-Forwarded-For is the client's to write: ignored unless proxies are declared.
    assert address("10.0.0.1", "198.51.100.1") == "10.0.0.1"
    settings.SAPO_NUM_PROXIES = 1
    assert address("10.0.0.1", "6.6.6.6, 198.51.100.1") == "198.51.100.1"


# --- log-in ---------------------------------------------------------------------------------------


def test_after_ten_wrong_passwords_even_the_right_one_is_refused(client, user):
    for _ in range(10):  # the default SAPO_LOGIN_FAILURES_PER_USER
        response = login(client, "alice", WRONG)
        assert response.status_code == 200 and "Please enter a correct username" in response.content.decode()
    response = login(client, "alice", DEFAULT_PASSWORD)
    assert response.status_code == 429
    page = response.content.decode()
    assert LOCKED in page and "locked for 15 more minute(s)" in page
    assert not logged_in(client)
    # From another address too: the username itself is locked ...
    assert login(Client(REMOTE_ADDR="198.51.100.9"), "alice", DEFAULT_PASSWORD).status_code == 429
    # ... but not the other accounts on this address (30 failures lock an address).
    make_user(username="bob", display_name="Bob")
    assert login(client, "bob", DEFAULT_PASSWORD).status_code == 302 and logged_in(client)


def test_the_admin_login_shares_the_lockout(client, settings):
    settings.SAPO_LOGIN_FAILURES_PER_USER = 4  # lowered: each attempt costs a password hash
    make_user(username="root", display_name="Root", is_staff=True, is_superuser=True)
    for _ in range(2):
        assert login(client, "root", WRONG).status_code == 200
    for _ in range(2):
        assert login(client, "root", WRONG, url=ADMIN_LOGIN).status_code == 200
    response = login(client, "root", DEFAULT_PASSWORD, url=ADMIN_LOGIN)
    assert response.status_code == 429  # as the site's log-in answers a locked attempt
    assert LOCKED in response.content.decode() and not logged_in(client)
    assert login(client, "root", DEFAULT_PASSWORD).status_code == 429 and not logged_in(client)


def test_the_lock_lifts_when_its_window_closes(client, user, settings, backend):
    # Lowered: one failure locks, for 2 s instead of 15 min. (A locked attempt is refused before any
    # password hashing, so it comes well within the window even on a loaded machine.)
    settings.SAPO_LOGIN_FAILURES_PER_USER = 1
    settings.SAPO_LOGIN_WINDOW_SECONDS = 2
    login(client, "alice", WRONG)
    assert login(client, "alice", DEFAULT_PASSWORD).status_code == 429
    time.sleep(2.1)
    assert login(client, "alice", DEFAULT_PASSWORD).status_code == 302 and logged_in(client)


def test_a_successful_log_in_clears_the_accounts_failures(client, user, settings):
    settings.SAPO_LOGIN_FAILURES_PER_USER = 3  # lowered: each attempt costs a password hash
    for _ in range(2):
        login(client, "alice", WRONG)
    assert login(client, "alice", DEFAULT_PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):  # four failures in the window, but two before the success no longer count
        login(client, "alice", WRONG)
    assert login(client, "alice", DEFAULT_PASSWORD).status_code == 302


def test_failures_from_one_address_lock_it_whatever_the_usernames(client, user, settings):
    settings.SAPO_LOGIN_FAILURES_PER_ADDRESS = 5  # lowered from 30: each attempt costs a password hash
    # Spraying: a different username each time, and a made-up X-Forwarded-For, which is not trusted.
    for i in range(5):
        assert login(client, f"guess{i}", WRONG, HTTP_X_FORWARDED_FOR=f"192.0.2.{i}").status_code == 200
    assert login(client, "alice", DEFAULT_PASSWORD).status_code == 429 and not logged_in(client)
    elsewhere = Client(REMOTE_ADDR="198.51.100.10")
    assert login(elsewhere, "alice", DEFAULT_PASSWORD).status_code == 302


# --- sign-ups -------------------------------------------------------------------------------------


def test_sign_ups_from_one_address_past_the_hours_limit_are_refused(client, settings):
    settings.SAPO_SIGNUPS_PER_ADDRESS_PER_HOUR = 3  # lowered from 10: each sign-up costs a password hash
    for i in range(3):
        data = {"username": f"new{i}", "display_name": f"New {i}", "password1": DEFAULT_PASSWORD}
        response = Client().post(SIGNUP, {**data, "password2": DEFAULT_PASSWORD})
        assert response.status_code == 302, response.content.decode()
    data = {"username": "new3", "display_name": "New 3", "password1": DEFAULT_PASSWORD, "password2": DEFAULT_PASSWORD}
    response = client.post(SIGNUP, data)
    assert response.status_code == 429
    assert "Too many sign-ups from your network" in response.content.decode()
    assert not User.objects.filter(username="new3").exists() and not logged_in(client)
    assert Client(REMOTE_ADDR="198.51.100.11").post(SIGNUP, data).status_code == 302


# --- nodes and tokens -----------------------------------------------------------------------------


def test_an_account_has_at_most_twenty_active_nodes_and_twenty_creations_an_hour(api_client, user):
    url = reverse("nodes-api:node-list")
    for i in range(20):  # the default SAPO_NODES_PER_ACCOUNT
        assert api_client.post(url, {"name": f"n{i}"}, format="json").status_code == 201
    response = api_client.post(url, {"name": "n20"}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "too_many_nodes" and response.json()["limit"] == 20
    assert Node.objects.filter(owner=user).count() == 20
    # Retiring one frees a place, but the hour's 20 creations (SAPO_NODE_CREATIONS_PER_HOUR) are spent:
    # retiring and re-creating cannot add rows without end.
    first = Node.objects.filter(owner=user).first()
    assert api_client.delete(reverse("nodes-api:node-detail", args=[first.id])).status_code == 204
    response = api_client.post(url, {"name": "n20"}, format="json")
    assert response.status_code == 429 and response.json()["code"] == "rate_limited"
    assert 0 < int(response["Retry-After"]) <= 3600 and response.json()["retry_after"] == int(response["Retry-After"])
    assert Node.objects.filter(owner=user).count() == 20
    # Someone else is not affected.
    other = APIClient()
    other.force_login(make_user(username="bob", display_name="Bob"))
    assert other.post(url, {"name": "n0"}, format="json").status_code == 201


def test_the_node_page_says_why_a_node_was_not_added(auth_client, user, settings):
    settings.SAPO_NODES_PER_ACCOUNT = 1  # lowered: one node is enough to reach it
    make_node(owner=user, name="first")
    response = auth_client.post(reverse("web:node-add"), {"name": "second"}, follow=True)
    assert "An account has at most 1 active nodes" in response.content.decode()
    assert list(Node.objects.filter(owner=user).values_list("name", flat=True)) == ["first"]


def test_eleven_token_rotations_in_an_hour_are_refused(api_client, user):
    node, other = make_node(owner=user, name="laptop"), make_node(owner=user, name="desk")
    url = reverse("nodes-api:node-token-rotate", args=[node.id])
    tokens = []
    for _ in range(10):  # the default SAPO_TOKEN_ROTATIONS_PER_HOUR
        response = api_client.post(url)
        assert response.status_code == 200
        tokens.append(response.json()["token"])
    response = api_client.post(url)
    assert response.status_code == 429 and response.json()["code"] == "rate_limited"
    assert "Too many token rotations" in response.json()["detail"]
    # The refused rotation changed nothing: the last token issued is still the active one.
    (active,) = node.tokens.filter(revoked_at__isnull=True)
    assert tokens[-1].startswith(active.prefix)
    assert api_client.post(reverse("nodes-api:node-token-rotate", args=[other.id])).status_code == 200


def test_operator_provisioning_is_not_limited(settings):
    settings.SAPO_TOKEN_ROTATIONS_PER_HOUR = 1  # lowered: a second rotation would be over it
    for _ in range(3):  # what restarting `make run` does
        node, token = node_provision(username="demo", node_name="local-1", rotate=True)
    assert node.tokens.filter(revoked_at__isnull=True).count() == 1


def test_answers_carrying_a_token_are_not_stored(api_client, user):
    created = api_client.post(reverse("nodes-api:node-list"), {"name": "laptop"}, format="json")
    assert created.status_code == 201 and created.json()["token"].startswith("sapo_")
    assert "no-store" in created["Cache-Control"]
    node_id = created.json()["id"]
    rotated = api_client.post(reverse("nodes-api:node-token-rotate", args=[node_id]))
    assert rotated.json()["token"].startswith("sapo_") and "no-store" in rotated["Cache-Control"]


# --- API throttles --------------------------------------------------------------------------------


def test_anonymous_api_reads_are_throttled_per_address(client):
    url = "/api/v1/leaderboard/"
    for _ in range(120):  # the default SAPO_API_RATE_ANON, 120/min
        assert client.get(url).status_code == 200
    response = client.get(url)
    assert response.status_code == 429 and response.json()["code"] == "throttled"
    assert 0 < int(response["Retry-After"]) <= 60
    assert Client(REMOTE_ADDR="198.51.100.12").get(url).status_code == 200


def test_signed_in_api_reads_are_throttled_per_user(api_client, settings):
    # Lowered from 600/min to keep the test short.
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": "5/min", "anon": "5/min"}}
    url = reverse("nodes-api:node-list")
    for _ in range(5):
        assert api_client.get(url).status_code == 200
    response = api_client.get(url)
    assert response.status_code == 429 and response.json()["code"] == "throttled"
    other = APIClient()
    other.force_login(make_user(username="bob", display_name="Bob"))
    assert other.get(url).status_code == 200


def test_a_malformed_api_rate_fails_at_start_up(tmp_path):
    from test_settings import run_settings

    result = run_settings({"SAPO_API_RATE_ANON": "lots", "SAPO_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0 and "SAPO_API_RATE_ANON='lots' is not a rate" in result.stderr
    assert run_settings({"SAPO_API_RATE_ANON": "30/hour", "SAPO_VAR_DIR": str(tmp_path)}).returncode == 0
