"""Webhook delivery to a URL a contributor typed: untrusted, so guarded.

- only http and https, no credentials in the URL, at most WEBHOOK_URL_MAX_LENGTH characters;
- every address the host name resolves to must be public (`address_is_public`: no loopback,
  private, link-local, shared, reserved or multicast range, and an IPv6 address that carries an IPv4
  one is judged by the IPv4 one or refused), checked when the URL is saved and again
  at each delivery, and the connection goes to the address that was checked (a second lookup could
  answer differently: DNS rebinding); https still verifies the certificate against the host name;
- short timeouts, no redirects (http.client follows none; a 3xx is a failure), bounded retries on
  connection errors and 5xx answers, the answer's body read to at most 1 KiB;
- a deadline for the whole delivery, attempts and pauses included (`SAPO_ALERT_WEBHOOK_DEADLINE`): a
  socket's timeout bounds each read, not a receiver that drips its answer a byte at a time or holds
  the connection open, so a watchdog shuts the connection at the deadline.

`settings.SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS` lists networks allowed despite the rule. It is not
read from the environment: it is empty on every deployment, and only the tests set it (to reach a
server they start on 127.0.0.1).

Each POST carries `X-Sapo-Timestamp` (Unix seconds) and `X-Sapo-Signature: sha256=<hex>`, the
HMAC-SHA256 with the contributor's secret of `<timestamp>.<body>` (docs/community.md, "Alerts").
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

from django.conf import settings

from alerts.models import WEBHOOK_URL_MAX_LENGTH
from common.errors import ApplicationError

#: Seconds between attempts: ATTEMPTS = len(BACKOFF) + 1.
BACKOFF = (0.5, 2.0)
MAX_BODY_READ = 1024


class WebhookRefused(ApplicationError):
    """The URL is not one the site may call; `field` names the form field (for the API's JSON too)."""

    def __init__(self, message: str, code: str = "webhook_refused") -> None:
        super().__init__(code, message, extra={"field": "webhook_url"})


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    #: The checked addresses the host resolved to; connections go to these, in order.
    addresses: tuple[str, ...]


#: Characters a URL's path and query keep as they are; any other (non-ASCII above all) is %-encoded.
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"


def normalise_url(url: str) -> str:
    """The URL in ASCII, as it is stored and requested: the host IDNA-encoded, the path and query
    %-encoded as UTF-8 (a %XX already there is kept), no fragment. Raises WebhookRefused (code
    webhook_invalid) for a URL the site does not call."""
    if len(url) > WEBHOOK_URL_MAX_LENGTH:
        raise WebhookRefused(f"The webhook URL has more than {WEBHOOK_URL_MAX_LENGTH} characters.", "webhook_invalid")
    if any(ord(c) < 33 or 127 <= ord(c) < 160 or c in "\u2028\u2029\ufeff" for c in url):
        raise WebhookRefused("The webhook URL contains spaces or control characters.", "webhook_invalid")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookRefused("The webhook URL must start with https:// (or http://).", "webhook_invalid")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("The webhook URL must not carry a user name or password.", "webhook_invalid")
    try:
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused("The webhook URL's port is not a number from 1 to 65535.", "webhook_invalid") from exc
    host = parts.hostname
    if not host or port == 0:
        raise WebhookRefused("The webhook URL has no host.", "webhook_invalid")
    if ":" in host:
        host = f"[{host}]"
    elif not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise WebhookRefused("The webhook URL's host is not a valid domain name.", "webhook_invalid") from exc
    if not host.isascii():
        raise WebhookRefused("The webhook URL's host is not a valid domain name.", "webhook_invalid")
    netloc = host + (f":{port}" if port else "")
    path, query = quote(parts.path, safe=_URL_SAFE), quote(parts.query, safe=_URL_SAFE)
    normal = urlunsplit((parts.scheme, netloc, path, query, ""))
    if len(normal) > WEBHOOK_URL_MAX_LENGTH:
        raise WebhookRefused(
            f"The webhook URL has more than {WEBHOOK_URL_MAX_LENGTH} characters once encoded.", "webhook_invalid"
        )
    return normal


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n) for n in getattr(settings, "SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS", ())]


#: Where the internet's IPv6 unicast addresses are (RFC 4291, 2000::/3); anything outside is refused.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
#: IPv6 forms that carry an IPv4 address where it can be read: the embedded address is checked instead.
#: Mapped ::ffff:a.b.c.d (RFC 4291), NAT64's well-known prefix (RFC 6052), 6to4 (RFC 3056).
V4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
#: IPv6 forms that carry an IPv4 address the site does not unwrap, refused whatever they carry:
#: IPv4-compatible ::a.b.c.d (deprecated), IPv4-translated ::ffff:0:a.b.c.d (SIIT), local-use NAT64
#: (RFC 8215: where the IPv4 address sits depends on the operator's prefix length), Teredo (RFC 4380:
#: reached through a relay), and ranges in 2000::/3 that are no destination (documentation, SRv6).
REFUSED_V6 = tuple(
    ipaddress.ip_network(n)
    for n in ("::/96", "::ffff:0:0:0/96", "64:ff9b:1::/48", "2001::/32", "3fff::/20", "5f00::/16")
)


def _ipv4_is_public(ip: ipaddress.IPv4Address) -> bool:
    return ip.is_global and not ip.is_multicast


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address a mapped, NAT64 (64:ff9b::/96) or 6to4 address carries; None for another form."""
    if ip in V4_MAPPED:
        return ip.ipv4_mapped
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
    if ip in SIX_TO_FOUR:
        return ip.sixtofour
    return None


def address_is_public(address: str) -> bool:
    """Whether the site may connect to `address`. IPv4: a global, non-multicast address. IPv6: one that
    carries IPv4 (mapped, NAT64, 6to4) is judged by the IPv4 address it carries; any other must be
    global unicast (2000::/3, `is_global`) outside REFUSED_V6."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if any(ip in network for network in _allowed_networks()):
        return True
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_is_public(ip)
    carried = embedded_ipv4(ip)
    if carried is not None:
        return _ipv4_is_public(carried)
    return ip in GLOBAL_UNICAST_V6 and ip.is_global and not any(ip in network for network in REFUSED_V6)


def resolve_target(url: str) -> Target:
    """The (normalised) URL's parts and its host's addresses, every one of them public. Raises WebhookRefused."""
    parts = urlsplit(normalise_url(url))
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"The webhook host {host!r} does not resolve.", "webhook_unresolved") from exc
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    refused = [a for a in addresses if not address_is_public(a)]
    if not addresses or refused:
        raise WebhookRefused(
            f"The webhook host {host!r} resolves to an address that is not public ({', '.join(refused)}): "
            "the site calls only public addresses."
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, path, addresses)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


class _Cuttable:
    """A connection another thread can end: a read or write blocked on it fails at once."""

    _raw: socket.socket | None = None
    was_cut = False

    def cut(self) -> None:
        self.was_cut = True
        raw = self._raw
        if raw is not None:
            with suppress(OSError):  # already closed
                raw.shutdown(socket.SHUT_RDWR)


class _PinnedHTTPConnection(_Cuttable, http.client.HTTPConnection):
    """Connects to a checked address; the Host header still names the host."""

    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = self._raw = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(_Cuttable, http.client.HTTPSConnection):
    """Connects to a checked address; TLS verifies the certificate against the host name (SNI too)."""

    def __init__(self, address: str, host: str, port: int, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        self._raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(self._raw, server_hostname=self.host)  # the handshake can be cut too


def _post_once(target: Target, address: str, headers: dict[str, str], body: bytes, timeout: float, ends: float) -> int:
    """One POST to one address, ended by the watchdog at `ends` (time.monotonic()) if still going."""
    kind = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    left = ends - time.monotonic()
    conn = kind(address, target.host, target.port, max(0.001, min(timeout, left)))
    watchdog = threading.Timer(max(0.0, left), conn.cut)
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(MAX_BODY_READ)
        if conn.was_cut:  # a cut answer can parse as a whole one: its headers end where the cut is
            raise TimeoutError("cut at the deadline")
        return response.status
    finally:
        watchdog.cancel()
        conn.close()


CAPPED = "capped (daily limit reached)"


def deliver(url: str, secret: str, body: bytes, *, may_post: Callable[[], bool] = lambda: True) -> str:
    """POST `body` to `url`, signed; returns "" on a 2xx answer, else why it failed (after retries).

    A refused target is not retried; nor is a 3xx (not followed) or 4xx answer. `may_post` is asked
    before every POST, retries included (the daily cap counts each one): when it says no, the delivery
    ends there (CAPPED if nothing was posted). Whatever the receiver does, it ends within
    SAPO_ALERT_WEBHOOK_DEADLINE seconds of the first connection."""
    try:
        target = resolve_target(url)
    except WebhookRefused as exc:
        return exc.message
    timeout = float(settings.SAPO_ALERT_WEBHOOK_TIMEOUT)
    deadline = float(settings.SAPO_ALERT_WEBHOOK_DEADLINE)
    ends = time.monotonic() + deadline
    out_of_time = f"no answer within the delivery's {deadline:g} s deadline"
    failure = ""
    for attempt in range(len(BACKOFF) + 1):
        if attempt:
            if time.monotonic() + BACKOFF[attempt - 1] >= ends:
                return failure or out_of_time
            time.sleep(BACKOFF[attempt - 1])
        timestamp = int(time.time())
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "sapo-swarm-alerts",
            "X-Sapo-Timestamp": str(timestamp),
            "X-Sapo-Signature": sign(secret, timestamp, body),
        }
        for address in target.addresses:
            if time.monotonic() >= ends:
                return out_of_time
            if not may_post():
                return failure or CAPPED
            try:
                status = _post_once(target, address, headers, body, timeout, ends)
            except (OSError, http.client.HTTPException) as exc:  # refused, timed out, TLS, bad answer, cut
                failure = out_of_time if time.monotonic() >= ends else f"{type(exc).__name__}: {exc}"[:200]
                continue
            if 200 <= status < 300:
                return ""
            failure = f"answered HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else "")
            if status < 500:
                return failure
            break  # a 5xx: the next attempt, after the pause
    return failure
