"""Counters behind the site's abuse limits: log-in failures (accounts.backends), sign-ups per address,
node creations and token rotations (nodes.services) and the REST API's throttles (accounts.throttling).
The limits themselves are settings (config/settings.py), documented in docs/moderation.md#limits;
those on password resets and address confirmations are constants below, documented in
docs/community.md ("Your account").

A counter is a window that opens at its first hit and closes `window` seconds later, whatever happens
in between: a limit of N per window lets through at most N hits in any window, with no burst at a
clock boundary (a fixed-minute window would let 2N through across one).

Where counts live: in Redis when REDIS_URL is set (one key per counter: SET NX EX, INCR and TTL in one
MULTI, so the key never loses its expiry), else in PostgreSQL (one `LimitCounter` row per counter,
upserted). Both are shared by every server process; process memory is not, so there is no in-process
fallback: a limit counted per process multiplies by the number of workers. While Redis is down the
counters go to PostgreSQL (one log line per outage, common.outage): the API, the log-in and the limits
keep working, their windows starting afresh there. While the process counts Redis as down, one use a
second tries it (common.outage): the others go to PostgreSQL at once.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone
from psycopg import sql
from redis.exceptions import RedisError

from accounts.models import LimitCounter
from common import outage
from common.composed import rendered
from common.errors import RateLimited
from common.redis_client import redis_client


@dataclass(frozen=True)
class Count:
    count: int  # hits in the open window (0: no window open)
    retry_after: int  # whole seconds until the window closes (0: no window open)


def _key(name: str, ident: str) -> str:
    # Hashed: idents are untrusted text (a username typed at the log-in form) of any length.
    return f"{name}:{hashlib.sha256(ident.encode('utf-8')).hexdigest()[:32]}"


def _redis_key(key: str) -> str:
    return f"{settings.SAPO_REDIS_PREFIX}:limit:{key}"


def hit(name: str, ident: str, *, window: int) -> Count:
    """Count one hit on counter (name, ident), opening a `window`-second window if none is open."""
    key = _key(name, ident)
    if settings.REDIS_URL and not outage.REDIS.skip():
        try:
            with redis_client().pipeline(transaction=True) as pipe:
                pipe.set(_redis_key(key), 0, ex=window, nx=True)
                pipe.incr(_redis_key(key))
                pipe.ttl(_redis_key(key))
                _, count, ttl = pipe.execute()
        except RedisError as exc:  # counted in PostgreSQL while Redis is down (one log line)
            outage.REDIS.failed(exc)
        else:
            outage.REDIS.answered()
            return Count(int(count), max(int(ttl), 1))
    now = timezone.now()
    # Raw SQL: one atomic INSERT ... ON CONFLICT increments the row or reopens an expired window;
    # the ORM has no upsert that adds to the stored value, and read-then-write would lose hits
    # between server processes. When the hit opens a window, the same statement sweeps the closed
    # ones (so the table stays small) without a second round trip: every API request counts a hit,
    # so this is the one query the throttle costs without Redis. The sweep skips the hit's own row:
    # both parts of one statement see the table as it was before it.
    with connection.cursor() as cursor:
        cursor.execute(
            _HIT_SQL,
            [key, now + timedelta(seconds=window), now, now, now, key],
        )
        count, expires_at = cursor.fetchone()
    return Count(count, max(math.ceil((expires_at - now).total_seconds()), 1))


# The counter's upsert and sweep (hit(), above), composed once.
_HIT_SQL = rendered(
    sql.SQL("""
WITH hit AS (
    INSERT INTO {table} (key, count, expires_at) VALUES (%s, 1, %s)
    ON CONFLICT (key) DO UPDATE SET
        count = CASE WHEN {table}.expires_at <= %s THEN 1 ELSE {table}.count + 1 END,
        expires_at = CASE WHEN {table}.expires_at <= %s THEN EXCLUDED.expires_at
                          ELSE {table}.expires_at END
    RETURNING count, expires_at
), swept AS (
    DELETE FROM {table}
    WHERE expires_at < %s AND key <> %s AND EXISTS (SELECT 1 FROM hit WHERE count = 1)
)
SELECT count, expires_at FROM hit
""").format(table=sql.Identifier(LimitCounter._meta.db_table))
)


def peek(name: str, ident: str) -> Count:
    """The counter as it stands, without counting."""
    key = _key(name, ident)
    if settings.REDIS_URL and not outage.REDIS.skip():
        try:
            with redis_client().pipeline(transaction=True) as pipe:
                pipe.get(_redis_key(key))
                pipe.ttl(_redis_key(key))
                count, ttl = pipe.execute()
        except RedisError as exc:  # what hit() counted in PostgreSQL meanwhile
            outage.REDIS.failed(exc)
        else:
            return Count(int(count), max(int(ttl), 1)) if count is not None and ttl != -2 else Count(0, 0)
    now = timezone.now()
    row = LimitCounter.objects.filter(key=key, expires_at__gt=now).values_list("count", "expires_at").first()
    if row is None:
        return Count(0, 0)
    return Count(row[0], max(math.ceil((row[1] - now).total_seconds()), 1))


def clear(name: str, ident: str) -> None:
    """Close the counter's window (its next hit opens a new one)."""
    key = _key(name, ident)
    if settings.REDIS_URL and not outage.REDIS.skip():
        try:
            redis_client().delete(_redis_key(key))
            return
        except RedisError as exc:  # what hit() counted in PostgreSQL meanwhile
            outage.REDIS.failed(exc)
    LimitCounter.objects.filter(key=key).delete()


def consume(name: str, ident: str, *, limit: int, window: int, what: str) -> None:
    """Count one hit; raise RateLimited (429, code "rate_limited") when it is over `limit` per window.
    `what` names the limit in the message ("node creations per hour")."""
    count = hit(name, ident, window=window)
    if count.count > limit:
        raise RateLimited(
            f"Too many {what} (limit {limit}). Try again in {_duration(count.retry_after)}.",
            retry_after=count.retry_after,
        )


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} seconds"
    return f"{math.ceil(seconds / 60)} minutes"


def client_address(request: HttpRequest) -> str:
    """The client's address as limits count it.

    REMOTE_ADDR, unless SAPO_NUM_PROXIES reverse proxies stand in front of the site: then the address
    the outermost trusted proxy saw, counted from the right of X-Forwarded-For (entries left of it are
    written by the client and could be anything). IPv6 addresses count per /64, the block one
    subscriber usually holds, so that hopping between its addresses buys nothing.
    """
    address = request.META.get("REMOTE_ADDR", "") or ""
    proxies = settings.SAPO_NUM_PROXIES
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    if proxies > 0 and forwarded:
        hops = [hop.strip() for hop in forwarded.split(",")]
        address = hops[-min(proxies, len(hops))]
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    if parsed.version == 6:
        if parsed.ipv4_mapped is not None:  # ::ffff:a.b.c.d is the IPv4 client a.b.c.d
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def signup_consume(request: HttpRequest) -> None:
    """A sign-up from this client's address; RateLimited past SAPO_SIGNUPS_PER_ADDRESS_PER_HOUR."""
    consume(
        "signup-address",
        client_address(request),
        limit=settings.SAPO_SIGNUPS_PER_ADDRESS_PER_HOUR,
        window=3600,
        what="sign-ups from your network in the last hour",
    )


#: Password-reset requests per client network per hour; over it the form answers 429.
PASSWORD_RESETS_PER_NETWORK_PER_HOUR = 10
#: Reset emails to one address per day, whoever asks; past it the request is answered as every other
#: one and no email goes (saying so would tell which addresses have accounts).
PASSWORD_RESETS_PER_ADDRESS_PER_DAY = 3


def password_reset_consume(request: HttpRequest) -> None:
    """A reset request from this client's network; RateLimited past PASSWORD_RESETS_PER_NETWORK_PER_HOUR."""
    consume(
        "password-reset-network",
        client_address(request),
        limit=PASSWORD_RESETS_PER_NETWORK_PER_HOUR,
        window=3600,
        what="password-reset requests from your network in the last hour",
    )


def password_reset_email_allowed(email: str) -> bool:
    """Count a reset email to `email`; False once the address had PASSWORD_RESETS_PER_ADDRESS_PER_DAY today."""
    count = hit("password-reset-address", email.strip().lower(), window=86400)
    return count.count <= PASSWORD_RESETS_PER_ADDRESS_PER_DAY


#: Confirmation emails a day: per account asking; per address from one client network; per address in
#: all. An address's own limit is per network, under a wider one for all, so accounts made on one
#: network cannot use up what its owner's network may still send it (docs/community.md, "Your account").
CONFIRMATIONS_PER_ACCOUNT_PER_DAY = 3
CONFIRMATIONS_PER_ADDRESS_PER_NETWORK_PER_DAY = 3
CONFIRMATIONS_PER_ADDRESS_PER_DAY = 10


def confirmation_consume(*, user_id: int, email: str, network: str) -> None:
    """Count a confirmation email to `email` asked by account `user_id` from client network `network`
    (client_address). RateLimited (code confirmation_limited), counting nothing, when any limit is spent."""
    address = email.strip().lower()
    counters = [
        ("confirm-account", str(user_id), CONFIRMATIONS_PER_ACCOUNT_PER_DAY, "for one account"),
        (
            "confirm-address-network",
            f"{address}\n{network}",
            CONFIRMATIONS_PER_ADDRESS_PER_NETWORK_PER_DAY,
            "to one address from your network",
        ),
        ("confirm-address", address, CONFIRMATIONS_PER_ADDRESS_PER_DAY, "to one address"),
    ]
    for name, ident, limit, what in counters:
        count = peek(name, ident)
        if count.count >= limit:
            raise RateLimited(
                f"At most {limit} confirmation emails a day {what}: try again in {_duration(count.retry_after)}.",
                retry_after=count.retry_after,
                code="confirmation_limited",
            )
    for name, ident, _, _ in counters:
        hit(name, ident, window=86400)
