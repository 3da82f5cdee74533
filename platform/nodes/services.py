"""Writes on nodes and their tokens. Every function validates its own input: callers include the
WebSocket consumer, which passes untrusted text from the node."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction
from django.utils import timezone
from psycopg import sql

from accounts import limits
from accounts.models import User
from common.composed import rendered
from common.errors import ApplicationError
from nodes.events import CLOSE_UNAUTHENTICATED, node_disconnect_on_commit, node_pause_on_commit
from nodes.models import NODE_NAME_MAX_LENGTH, Node, NodeToken
from sapo_node.protocol import NODE_PREPARING, PAUSE_SITE

TOKEN_PREFIX = "sapo_"
#: Characters of the plaintext kept (unhashed) for display: "sapo_" + 8.
TOKEN_DISPLAY_LENGTH = len(TOKEN_PREFIX) + 8
_TOKEN_MAX_LENGTH = 128
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._\-]*$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
#: Don't write last_seen_at / last_used_at more often than this per node (one write per message
#: would be wasteful); status windows are minutes long.
SEEN_WRITE_INTERVAL = timedelta(seconds=10)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _clean_name(name: str) -> str:
    name = " ".join(str(name).split())
    if not name or len(name) > NODE_NAME_MAX_LENGTH or not _NAME_RE.match(name):
        raise ApplicationError(
            "invalid_name",
            f"A node name has 1-{NODE_NAME_MAX_LENGTH} characters: letters, digits, space, '.', '_' or '-', "
            "starting with a letter or digit.",
        )
    return name


def _clean_text(value: object, max_length: int) -> str:
    """Self-reported free text: a string without control characters, cut to the column's length."""
    if not isinstance(value, str):
        return ""
    return _CONTROL_RE.sub("", value).strip()[:max_length]


def _ensure_not_retired(node: Node) -> None:
    if node.retired_at is not None:
        raise ApplicationError("node_retired", "This node is retired.", status=409)


def node_create(*, owner: User, name: str, model_id: str = "", hardware: str = "") -> Node:
    """A contributor adds a node. Besides `_node_create`'s checks, the account's limits: at most
    SAPO_NODES_PER_ACCOUNT active nodes and SAPO_NODE_CREATIONS_PER_HOUR creations (retiring and
    re-creating would otherwise add rows without end).

    Raises ApplicationError: invalid_name, name_taken (409), banned (403), too_many_nodes (409),
    rate_limited (429).
    """
    if owner.banned_at is not None:
        raise ApplicationError("banned", "Your account is banned from the swarm.", status=403)
    name = _clean_name(name)  # a mistyped name costs no creation
    with transaction.atomic():
        # The owner's row lock makes count-then-insert safe against the same account's concurrent requests.
        User.objects.select_for_update().filter(id=owner.id).exists()
        cap = settings.SAPO_NODES_PER_ACCOUNT
        if Node.objects.filter(owner=owner, retired_at__isnull=True).count() >= cap:
            raise ApplicationError(
                "too_many_nodes",
                f"An account has at most {cap} active nodes. Retire one you no longer run to add another.",
                status=409,
                extra={"limit": cap},
            )
        limits.consume(
            "node-create",
            str(owner.id),
            limit=settings.SAPO_NODE_CREATIONS_PER_HOUR,
            window=3600,
            what="node creations in the last hour",
        )
        return _node_create(owner=owner, name=name, model_id=model_id, hardware=hardware)


def _node_create(*, owner: User, name: str, model_id: str = "", hardware: str = "") -> Node:
    """Raises ApplicationError: invalid_name, name_taken (409), banned (403)."""
    if owner.banned_at is not None:
        raise ApplicationError("banned", "Your account is banned from the swarm.", status=403)
    node = Node(
        owner=owner,
        name=_clean_name(name),
        model_id=_clean_text(model_id, Node._meta.get_field("model_id").max_length),
        hardware=_clean_text(hardware, Node._meta.get_field("hardware").max_length),
    )
    try:
        with transaction.atomic():
            node.save()
    except IntegrityError as exc:
        raise ApplicationError("name_taken", f"You already have a node named {node.name!r}.", status=409) from exc
    return node


def node_token_issue(*, node: Node) -> tuple[NodeToken, str]:
    """Create a token for the node; the plaintext is returned here and never stored or shown again."""
    _ensure_not_retired(node)
    plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = NodeToken.objects.create(
        node=node, token_hash=token_hash(plaintext), prefix=plaintext[:TOKEN_DISPLAY_LENGTH]
    )
    return token, plaintext


@transaction.atomic
def node_token_revoke(*, node: Node) -> int:
    """Revoke every active token of the node and close its open sockets (4401): the revocation and the
    order to close (nodes.events) commit together. Returns how many."""
    revoked = NodeToken.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=timezone.now())
    if revoked:
        node_disconnect_on_commit(node_id=node.id, code=CLOSE_UNAUTHENTICATED, reason="token_revoked")
    return revoked


def node_token_rotate(*, node: Node) -> str:
    """A contributor rotates the node's token: at most SAPO_TOKEN_ROTATIONS_PER_HOUR times per node.
    Returns the new plaintext (shown once). Raises ApplicationError: node_retired (409), rate_limited (429)."""
    _ensure_not_retired(node)
    limits.consume(
        "token-rotate",
        str(node.id),
        limit=settings.SAPO_TOKEN_ROTATIONS_PER_HOUR,
        window=3600,
        what="token rotations for this node in the last hour",
    )
    return _node_token_rotate(node=node)


@transaction.atomic
def _node_token_rotate(*, node: Node) -> str:
    """Revoke the node's tokens and issue a new one; returns its plaintext (shown once)."""
    _ensure_not_retired(node)
    node_token_revoke(node=node)
    _, plaintext = node_token_issue(node=node)
    return plaintext


@transaction.atomic
def node_provision(*, username: str, node_name: str, model_id: str = "", rotate: bool = False) -> tuple[Node, str]:
    """Get or create the contributor `username` (unusable password) and their node `node_name`, and
    issue a token, for headless set-ups: `sapo_node_token`, compose and `make run`'s local swarm.

    With rotate=True earlier tokens are revoked; otherwise they stay valid. Returns (node, plaintext).
    An operator's path (manage.py, never reachable from the web or the API): the per-account limits of
    node_create and node_token_rotate do not apply, so a local swarm restarts as often as it likes.
    """
    from accounts.services import display_name_is_taken, user_create

    user = User.objects.filter(username=username).first()
    if user is None:
        display_name = username if not display_name_is_taken(username) else f"{username}-{User.objects.count() + 1}"
        user = user_create(username=username, display_name=display_name, password=None)
    node = Node.objects.filter(owner=user, name=node_name, retired_at__isnull=True).first()
    if node is None:
        node = _node_create(owner=user, name=node_name, model_id=model_id)
    plaintext = _node_token_rotate(node=node) if rotate else node_token_issue(node=node)[1]
    return node, plaintext


def node_rename(*, node: Node, name: str) -> Node:
    """Raises ApplicationError: invalid_name, name_taken (409), node_retired (409)."""
    _ensure_not_retired(node)
    node.name = _clean_name(name)
    try:
        with transaction.atomic():
            node.save(update_fields=["name"])
    except IntegrityError as exc:
        raise ApplicationError("name_taken", f"You already have a node named {node.name!r}.", status=409) from exc
    return node


@transaction.atomic
def node_retire(*, node: Node) -> Node:
    """Retire the node for good: its tokens are revoked, its name freed, its history kept."""
    if node.retired_at is not None:
        return node
    node.retired_at = timezone.now()
    node.save(update_fields=["retired_at"])
    node_token_revoke(node=node)
    return node


@transaction.atomic
def node_pause_set(*, node: Node, paused: bool) -> Node:
    """The owner pauses the node (it finishes its step and waits, keeping what it holds) or resumes it.
    Its open sockets are told once this commits (nodes.events); a node connecting later learns it from
    its welcome. Raises ApplicationError node_retired (409)."""
    _ensure_not_retired(node)
    if (node.paused_at is not None) == paused:
        return node
    node.paused_at = timezone.now() if paused else None
    node.save(update_fields=["paused_at"])
    node_pause_on_commit(node_id=node.id, paused=paused)
    return node


def node_status_fields(
    *,
    state: str,
    paused_for: Sequence[str],
    round_seconds: float | None,
    tokens_per_second: float | None,
    preparing: str = "",
    progress: float | None = None,
    eta_seconds: float | None = None,
) -> dict[str, object]:
    """What a node says in `status` (parsed and bounded by sockets.messages), as Node fields. What it
    prepares is kept only while it says it prepares."""
    preparing_now = state == NODE_PREPARING
    return {
        "reported_state": state,
        "reported_paused": PAUSE_SITE in paused_for,
        "round_seconds": round_seconds,
        "tokens_per_second": tokens_per_second,
        "reported_preparing": preparing if preparing_now else "",
        "reported_progress": progress if preparing_now else None,
        "reported_eta_seconds": eta_seconds if preparing_now else None,
    }


def node_hello_fields(*, client: object, model: object, hardware: object) -> dict[str, str]:
    """What a node says about itself in `hello`, cleaned and cut to length (untrusted), as Node fields."""
    return {
        "client_version": _clean_text(client, Node._meta.get_field("client_version").max_length),
        "model_id": _clean_text(model, Node._meta.get_field("model_id").max_length),
        "hardware": _clean_text(hardware, Node._meta.get_field("hardware").max_length),
    }


def node_hello_changed(*, node: Node, fields: dict[str, str]) -> bool:
    """Whether `fields` (node_hello_fields) differ from what `node` holds. No database: a node
    reconnecting says the same hello again, and then nothing is to be written."""
    return any(getattr(node, name) != value for name, value in fields.items())


# A statement that updates several node rows locks them in id order first (`WITH ... UPDATE ...
# WHERE id IN (SELECT id FROM locked)`, the ids as the first parameter): two such statements (these,
# nodes.sessions's) then never wait on each other in a cycle (a deadlock PostgreSQL breaks after a
# second by failing one).
_LOCKED_IN_ID_ORDER = sql.SQL(
    "locked AS (SELECT id FROM nodes_node WHERE id = ANY(%s::bigint[]) ORDER BY id FOR NO KEY UPDATE)"
)
_HELLOS_SQL = rendered(
    sql.SQL("""
WITH {locked}
UPDATE nodes_node n
SET client_version = v.client_version, model_id = v.model_id, hardware = v.hardware
FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) AS v(id, client_version, model_id, hardware),
     (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE n.id = v.id AND n.id IN (SELECT id FROM locked)
""").format(locked=_LOCKED_IN_ID_ORDER)
)
_SEEN_SQL = rendered(
    sql.SQL("""
WITH {locked}
UPDATE nodes_node SET last_seen_at = %s
WHERE id IN (SELECT id FROM locked) AND (last_seen_at IS NULL OR last_seen_at < %s)
""").format(locked=_LOCKED_IN_ID_ORDER)
)


def nodes_record_hellos(*, hellos: dict[int, dict[str, str]]) -> int:
    """Store what several nodes said in `hello` (node id -> node_hello_fields), in one statement whose
    commit does not wait for the disk: nodes.presence.SocketBook writes a beat's hellos this way (a
    node's first hello comes with its first connect, a thousand at once when a new swarm starts).
    A hello a crash loses is said again at the node's next connect. Returns the rows written."""
    if not hellos:
        return 0
    ids = list(hellos)
    with connection.cursor() as cursor:
        cursor.execute(
            _HELLOS_SQL,
            [
                ids,
                ids,
                [hellos[i]["client_version"] for i in ids],
                [hellos[i]["model_id"] for i in ids],
                [hellos[i]["hardware"] for i in ids],
            ],
        )
        return cursor.rowcount


def nodes_mark_seen(*, node_ids: Iterable[int], now: datetime | None = None) -> int:
    """These nodes just sent something (one UPDATE for all; each row written at most once per
    SEEN_WRITE_INTERVAL). Returns how many rows were written."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            _SEEN_SQL,
            [sorted(set(node_ids)), now, now - SEEN_WRITE_INTERVAL],
        )
        return cursor.rowcount


_STATUSES_SQL = rendered(
    sql.SQL("""
WITH {locked}
UPDATE nodes_node n
SET reported_state = v.state, reported_paused = v.paused, round_seconds = COALESCE(v.round_seconds, n.round_seconds),
    tokens_per_second = COALESCE(v.tokens_per_second, n.tokens_per_second), reported_preparing = v.preparing,
    reported_progress = v.progress, reported_eta_seconds = v.eta_seconds, reported_at = %s
FROM unnest(%s::bigint[], %s::text[], %s::boolean[], %s::float8[], %s::float8[], %s::text[], %s::float8[], %s::float8[])
         AS v(id, state, paused, round_seconds, tokens_per_second, preparing, progress, eta_seconds),
     (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE n.id = v.id AND n.id IN (SELECT id FROM locked)
""").format(locked=_LOCKED_IN_ID_ORDER)
)


def nodes_record_statuses(*, statuses: dict[int, dict[str, object]], now: datetime | None = None) -> int:
    """Store what several nodes said in `status` (node id -> node_status_fields) in one statement whose
    commit does not wait for the disk, as nodes_record_hellos (presence.SocketBook's beat); a figure a
    status leaves out keeps the last one. Returns the rows written."""
    if not statuses:
        return 0
    ids = list(statuses)
    with connection.cursor() as cursor:
        cursor.execute(
            _STATUSES_SQL,
            [
                ids,
                now or timezone.now(),
                ids,
                [statuses[i]["reported_state"] for i in ids],
                [statuses[i]["reported_paused"] for i in ids],
                [statuses[i]["round_seconds"] for i in ids],
                [statuses[i]["tokens_per_second"] for i in ids],
                [statuses[i]["reported_preparing"] for i in ids],
                [statuses[i]["reported_progress"] for i in ids],
                [statuses[i]["reported_eta_seconds"] for i in ids],
            ],
        )
        return cursor.rowcount


def node_select_columns(alias: str) -> sql.Composed:
    """The select list of every Node column of the table named `alias`, in the model's field order,
    for `node_from_row`."""
    return sql.SQL(", ").join(sql.Identifier(alias, field.column) for field in Node._meta.concrete_fields)


def node_from_row(values: Sequence[object]) -> Node:
    """A Node from the values `node_select_columns` selected (every field loaded: it can be saved)."""
    return Node.from_db(DEFAULT_DB_ALIAS, _NODE_ATTNAMES, list(values))


_NODE_ATTNAMES = [field.attname for field in Node._meta.concrete_fields]


def token_is_well_formed(token: object) -> bool:
    """Whether `token` could be a node token at all (checked before any hashing or database work)."""
    return isinstance(token, str) and token.startswith(TOKEN_PREFIX) and len(token) <= _TOKEN_MAX_LENGTH
