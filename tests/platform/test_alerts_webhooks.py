"""Webhook alerts against a real HTTP server on 127.0.0.1: signed POSTs, no redirects, bounded
retries, short timeouts, and the guard that refuses loopback (and every non-public address) unless
the test-only setting SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS lets it through."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import connection
from django.utils import timezone
from factories import make_node, make_node_token, make_user

from alerts import webhooks
from alerts.check import alerts_check
from alerts.models import Alert, AlertSettings
from alerts.services import alert_settings_update
from nodes.models import Node
from pool.models import NodeVerdictCounts

pytestmark = pytest.mark.django_db


class Hook:
    """A webhook receiver: answers each POST with the next of `answers` (the last repeats)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.answers: list[int] = [204]
        self.delay = 0.0
        self.on_request = lambda: None
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests.append((self.path, dict(self.headers), body))
                hook.on_request()
                time.sleep(hook.delay)
                status = hook.answers[min(len(hook.requests), len(hook.answers)) - 1]
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", f"http://127.0.0.1:{hook.port}/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hooks/sapo?k=1"

    def __enter__(self) -> Hook:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    with Hook() as h:
        yield h


@pytest.fixture
def loopback_allowed(settings):
    settings.SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.SAPO_ALERT_WEBHOOK_TIMEOUT = 0.5


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(webhooks, "BACKOFF", (0.05, 0.05))


def _silent_node_with_webhook(url: str, secret: str = "whsec_test") -> Node:
    user = make_user()
    AlertSettings.objects.create(user=user, webhook_url=url, webhook_secret=secret, silence_minutes=5)
    node = make_node(owner=user, name="gpu-box")
    make_node_token(node=node)
    NodeVerdictCounts.objects.create(node=node, accepted_groups=1)
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now() - timedelta(minutes=20))
    return node


def test_the_default_guard_refuses_loopback_and_sends_nothing(hook):
    node = _silent_node_with_webhook(hook.url)
    result = alerts_check()
    assert (result.raised, result.sent, result.failed) == (1, 0, 1)
    (alert,) = Alert.objects.filter(node=node)
    assert alert.raised_delivery.startswith("webhook failed: The webhook host '127.0.0.1' resolves to an address")
    assert hook.requests == []


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.8",
        "172.16.5.4",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address):
    assert not webhooks.address_is_public(address)
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(webhooks.WebhookRefused):
        webhooks.resolve_target(f"https://{host}/hook")


#: IPv6 spellings that carry a loopback, private, link-local (the cloud metadata address) or otherwise
#: unwrapped IPv4 address: each is refused when saved through the form and again at delivery.
EMBEDDED_IPV4 = [
    "64:ff9b::7f00:1",  # NAT64 well-known prefix, 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64, 169.254.169.254 (the metadata address on a NAT64 host)
    "64:ff9b::a00:8",  # NAT64, 10.0.0.8
    "64:ff9b:1::7f00:1",  # local-use NAT64: refused whatever it carries
    "64:ff9b:1:5db8:d822::",  # local-use NAT64 carrying a public address: refused too
    "2002:7f00:1::1",  # 6to4, 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4, 169.254.169.254
    "2002:c0a8:101::1",  # 6to4, 192.168.1.1
    "::7f00:1",  # IPv4-compatible, 127.0.0.1
    "::a9fe:a9fe",  # IPv4-compatible, 169.254.169.254
    "::5db8:d822",  # IPv4-compatible (deprecated), public: refused whatever it carries
    "::ffff:7f00:1",  # IPv4-mapped, 127.0.0.1
    "::ffff:a9fe:a9fe",  # IPv4-mapped, 169.254.169.254
    "::ffff:0:7f00:1",  # IPv4-translated, 127.0.0.1
    "::ffff:0:a9fe:a9fe",  # IPv4-translated, 169.254.169.254
    "2001:0:a9fe:a9fe::",  # Teredo, server 169.254.169.254
    "2001:0:5db8:d822::80ff:fffe",  # Teredo, public server, client 127.0.0.1 (obfuscated)
    "fec0::1",  # site-local (deprecated), which ipaddress calls global
    "3fff::1",  # documentation (RFC 9637)
]


@pytest.mark.parametrize("address", EMBEDDED_IPV4)
def test_an_ipv6_form_carrying_a_non_public_address_is_refused_by_the_form(auth_client, user, address):
    data = {"webhook_url": f"http://[{address}]:8080/hook", "silence_minutes": "30", "min_acceptance": "50"}
    page = auth_client.post("/me/alerts/", data, follow=True).content.decode()
    assert "resolves to an address that is not public" in page
    assert not AlertSettings.objects.filter(user=user).exists()


@pytest.mark.parametrize("address", EMBEDDED_IPV4)
def test_an_ipv6_form_carrying_a_non_public_address_is_refused_at_delivery(address):
    """A URL stored before the rule covered it is checked again before each delivery: no connection."""
    node = _silent_node_with_webhook(f"http://[{address}]:8080/hook")
    assert alerts_check().failed == 1
    note = Alert.objects.get(node=node).raised_delivery
    assert note.startswith("webhook failed: The webhook host") and "is not public" in note


@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "2002:5db8:d822::1", "::ffff:5db8:d822"])
def test_an_ipv6_form_carrying_a_public_address_passes_the_rule(address):
    assert webhooks.address_is_public(address)  # 93.184.216.34, reached through NAT64, 6to4, mapped


def test_public_addresses_pass_the_rule():
    assert webhooks.address_is_public("93.184.216.34") and webhooks.address_is_public("2606:4700::1111")


def test_a_host_name_is_checked_after_resolution():
    with pytest.raises(webhooks.WebhookRefused, match="resolves to an address that is not public"):
        webhooks.resolve_target("http://localhost:8000/hook")  # a name, but loopback once resolved


def test_alert_and_recovery_are_posted_signed(hook, loopback_allowed):
    node = _silent_node_with_webhook(hook.url, secret="whsec_s3cret")
    assert alerts_check().sent == 1
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now())
    assert alerts_check().cleared == 1
    assert [r[0] for r in hook.requests] == ["/hooks/sapo?k=1"] * 2
    kinds = []
    for _, headers, body in hook.requests:
        timestamp = headers["X-Sapo-Timestamp"]
        expected = hmac.new(b"whsec_s3cret", f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
        assert headers["X-Sapo-Signature"] == f"sha256={expected}"
        assert abs(int(timestamp) - time.time()) < 60 and headers["Content-Type"] == "application/json"
        payload = json.loads(body)
        assert payload["condition"] == "silent" and payload["node"] == {"id": node.id, "name": "gpu-box"}
        kinds.append(payload["type"])
    assert kinds == ["alert", "recovered"]
    alert = Alert.objects.get(node=node)
    assert (alert.raised_delivery, alert.cleared_delivery) == ("webhook", "webhook")


def test_a_redirect_is_not_followed(hook, loopback_allowed, quick_retries):
    hook.answers = [302]
    failure = webhooks.deliver(hook.url, "whsec_x", b"{}")
    assert failure == "answered HTTP 302 (redirects are not followed)"
    assert [r[0] for r in hook.requests] == ["/hooks/sapo?k=1"]  # once, and never /elsewhere


def test_server_errors_are_retried_a_bounded_number_of_times(hook, loopback_allowed, quick_retries):
    hook.answers = [500]
    assert webhooks.deliver(hook.url, "whsec_x", b"{}") == "answered HTTP 500"
    assert len(hook.requests) == len(webhooks.BACKOFF) + 1

    hook.requests.clear()
    hook.answers = [503, 200]
    assert webhooks.deliver(hook.url, "whsec_x", b"{}") == ""
    assert len(hook.requests) == 2


def test_a_client_error_is_not_retried(hook, loopback_allowed, quick_retries):
    hook.answers = [404]
    assert webhooks.deliver(hook.url, "whsec_x", b"{}") == "answered HTTP 404"
    assert len(hook.requests) == 1


def test_a_slow_receiver_times_out(hook, loopback_allowed, quick_retries):
    hook.delay = 1.5
    started = time.monotonic()
    failure = webhooks.deliver(hook.url, "whsec_x", b"{}")
    assert "timed out" in failure
    assert time.monotonic() - started < 3 * (0.5 + 0.2) + 0.5  # three attempts of the 0.5 s timeout


class Drip:
    """A receiver that reads the request, then answers a status line and one header byte every 0.1 s,
    forever (each read on the socket gets something before its timeout), or, with `silent`, nothing."""

    def __init__(self, silent: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.silent = silent
        self.stop = threading.Event()
        self.connected = threading.Event()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            self.connected.set()
            if not self.silent:
                conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not self.stop.wait(0.1):
                if not self.silent:
                    try:
                        conn.sendall(b"a")
                    except OSError:
                        return

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def __enter__(self) -> Drip:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.listener.close()


def test_a_receiver_that_drips_its_answer_is_cut_at_the_deadline(loopback_allowed, quick_retries, settings):
    """Each read gets a byte before the 0.5 s timeout, so only the delivery's deadline ends it."""
    settings.SAPO_ALERT_WEBHOOK_DEADLINE = 1.5
    with Drip() as drip:
        started = time.monotonic()
        failure = webhooks.deliver(drip.url, "whsec_x", b"{}")
        took = time.monotonic() - started
    assert failure == "no answer within the delivery's 1.5 s deadline"
    assert 1.4 < took < 2.5


def test_a_receiver_that_holds_its_answer_delays_no_one_elses_alert(hook, loopback_allowed, settings):
    """Two contributors' alerts in one check: the first's receiver never answers; the second's message
    arrives while the first is still waiting, and both deliveries are recorded."""
    settings.SAPO_ALERT_WEBHOOK_TIMEOUT = 5.0
    settings.SAPO_ALERT_WEBHOOK_DEADLINE = 2.0
    with Drip(silent=True) as held:
        slow = _silent_node_with_webhook(held.url)
        quick = _silent_node_with_webhook(hook.url)
        assert slow.id < quick.id  # the held receiver's message is the first sent
        started = time.monotonic()
        arrived: list[float] = []
        hook.on_request = lambda: arrived.append(time.monotonic() - started)
        result = alerts_check()
        took = time.monotonic() - started
    assert (result.raised, result.sent, result.failed) == (2, 1, 1)
    assert arrived and arrived[0] < 1.0 < took  # the quick one did not wait for the held one's deadline
    assert (
        Alert.objects.get(node=slow).raised_delivery == "webhook failed: no answer within the delivery's 2 s deadline"
    )
    assert Alert.objects.get(node=quick).raised_delivery == "webhook"


# ---------------------------------------------------------------------------- one URL, everyone's alerts


def test_a_non_ascii_url_is_stored_encoded(auth_client, user, hook, loopback_allowed):
    data = {"webhook_url": f"http://127.0.0.1:{hook.port}/é?q=ü", "silence_minutes": "30", "min_acceptance": "50"}
    auth_client.post("/me/alerts/", data)
    assert AlertSettings.objects.get(user=user).webhook_url == f"http://127.0.0.1:{hook.port}/%C3%A9?q=%C3%BC"


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("https://Bücher.example/hooks/é", "https://xn--bcher-kva.example/hooks/%C3%A9"),
        ("https://example.org/a%20b?x=<y>#frag", "https://example.org/a%20b?x=%3Cy%3E"),
        ("http://[2606:4700::1111]:8080/h", "http://[2606:4700::1111]:8080/h"),
    ],
)
def test_urls_are_normalised_to_ascii(url, normal):
    assert webhooks.normalise_url(url) == normal


@pytest.mark.parametrize(
    "url", ["http://" + "é" * 70 + ".example/", "http://a\u2028b.example/", "ftp://example.org/", "http://u:p@x.org/"]
)
def test_a_url_the_site_cannot_call_is_refused_with_a_typed_error_naming_the_field(user, url):
    with pytest.raises(webhooks.WebhookRefused) as refused:
        alert_settings_update(user=user, email_alerts=False, webhook_url=url, silence_minutes=30, min_acceptance=0.5)
    assert refused.value.code == "webhook_invalid" and refused.value.extra == {"field": "webhook_url"}
    assert not AlertSettings.objects.filter(user=user).exists()


@pytest.mark.parametrize(
    ("stored", "note"),
    [
        ("/é?q=ü", "webhook"),  # encoded at delivery, and it arrives
        ("", "webhook failed: The webhook URL's host is not a valid domain name."),
    ],
)
def test_a_url_stored_before_it_was_checked_fails_only_its_own_message(hook, loopback_allowed, stored, note):
    """A URL saved by an earlier version (never through the form): its message goes or fails alone; the
    other contributor's message is sent and recorded as sent."""
    url = f"http://127.0.0.1:{hook.port}{stored}" if stored else "http://" + "é" * 70 + ".example/hook"
    odd = _silent_node_with_webhook(url)
    plain = _silent_node_with_webhook(hook.url)
    result = alerts_check()
    assert result.raised == 2
    assert Alert.objects.get(node=odd).raised_delivery == note
    other = Alert.objects.get(node=plain)
    assert (other.raised_delivery, other.raised_sent) == ("webhook", True)
    paths = sorted(r[0] for r in hook.requests)
    assert "/hooks/sapo?k=1" in paths
    if stored:
        assert "/%C3%A9?q=%C3%BC" in paths


def test_failed_posts_count_against_the_daily_cap(hook, loopback_allowed, quick_retries, settings):
    """A receiver answering 500 gets at most the cap's number of POSTs in 24 hours, retries included."""
    settings.SAPO_ALERT_DAILY_CAP = 3
    hook.answers = [500]
    user = make_user()
    AlertSettings.objects.create(user=user, webhook_url=hook.url, webhook_secret="whsec_x", silence_minutes=5)
    nodes = []
    for i in range(4):
        node = make_node(owner=user, name=f"box-{i}")
        make_node_token(node=node)
        NodeVerdictCounts.objects.create(node=node, accepted_groups=1)
        nodes.append(node)
    Node.objects.filter(owner=user).update(last_seen_at=timezone.now() - timedelta(minutes=20))
    first = alerts_check()
    assert first.raised == 4 and len(hook.requests) == 3
    Node.objects.filter(owner=user).update(last_seen_at=timezone.now())
    second = alerts_check()
    assert second.cleared == 4 and second.capped == 4 and len(hook.requests) == 3
    notes = sorted(Alert.objects.filter(user=user).values_list("raised_delivery", flat=True))
    assert notes.count("capped (daily limit reached)") >= 1 and "webhook failed: answered HTTP 500" in notes
    # a day later the nodes are silent again and the cap has room for 3 more POSTs, no more
    later = alerts_check(now=timezone.now() + timedelta(days=1, minutes=1))
    assert later.raised == 4 and len(hook.requests) == 6


@pytest.mark.django_db(transaction=True)
def test_a_held_delivery_holds_no_lock(hook, loopback_allowed, settings):
    """While one check waits on a receiver that never answers, the next check raises and sends its own
    alerts: the lock covers deciding and reserving, not sending."""
    settings.SAPO_ALERT_WEBHOOK_TIMEOUT = 5.0
    settings.SAPO_ALERT_WEBHOOK_DEADLINE = 3.0
    results = {}

    def first_check() -> None:
        try:
            results["first"] = alerts_check()
        finally:
            connection.close()

    with Drip(silent=True) as held:
        _silent_node_with_webhook(held.url)
        thread = threading.Thread(target=first_check)
        thread.start()
        assert held.connected.wait(10)
        _silent_node_with_webhook(hook.url)
        started = time.monotonic()
        second = alerts_check()
        took = time.monotonic() - started
        thread.join(10)
    assert (second.raised, second.sent) == (1, 1) and took < 2.0
    assert (results["first"].raised, results["first"].failed) == (1, 1)
