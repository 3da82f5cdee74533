from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models.functions import Now
from django.utils import timezone

NODE_NAME_MAX_LENGTH = 64

#: A connected node that sent something within this window is "online"; quieter but connected
#: nodes are "idle".
ONLINE_WINDOW = timedelta(minutes=2)
#: Past this silence a connected node counts as "offline" (a socket held open without a frame).
IDLE_WINDOW = timedelta(hours=1)


class NodeStatus(models.TextChoices):
    ONLINE = "online", "Online"
    IDLE = "idle", "Idle"
    OFFLINE = "offline", "Offline"
    BANNED = "banned", "Banned"
    RETIRED = "retired", "Retired"
    UNKNOWN = "unknown", "Unknown"  # presence cannot be read now (Redis does not answer)


class Node(models.Model):
    """A contributor's compute node. Its status is derived, never stored:

    - banned:  `banned_at` is set on the node or on its owner;
    - retired: `retired_at` is set (tokens revoked, kept for history);
    - online:  connected (an open WebSocket in nodes.presence, which expires when its server stops
               renewing it) and seen within ONLINE_WINDOW;
    - idle:    connected but quiet for longer, up to IDLE_WINDOW;
    - offline: otherwise.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=NODE_NAME_MAX_LENGTH)
    model_id = models.CharField(max_length=200, blank=True, help_text="Model the node trains (self-reported).")
    hardware = models.CharField(max_length=200, blank=True, help_text="Self-reported hardware description.")
    client_version = models.CharField(max_length=64, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    banned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)
    # The owner's pause from the site (nodes.services.node_pause_set): the node's sockets are told at
    # once, and a node connecting meanwhile learns it from its welcome.
    paused_at = models.DateTimeField(null=True, blank=True, help_text="Paused by its owner since (null: not paused).")
    # What the node's client last said in `status` (self-reported; written with presence's beat).
    reported_state = models.CharField(
        max_length=16, blank=True, help_text="preparing, training, paused or idle (empty: never said)."
    )
    reported_paused = models.BooleanField(default=False, help_text="Its client holds the site's pause.")
    round_seconds = models.FloatField(null=True, blank=True, help_text="Its last round's seconds.")
    tokens_per_second = models.FloatField(null=True, blank=True, help_text="Its last round's generation speed.")
    # While preparing: what it does (sapo_node.protocol.PREPARING_STEPS), how far, and the seconds left it said.
    reported_preparing = models.CharField(
        max_length=16, blank=True, help_text="load, download or build (empty: not said)."
    )
    reported_progress = models.FloatField(null=True, blank=True, help_text="How far its preparing is (0 to 1).")
    reported_eta_seconds = models.FloatField(null=True, blank=True, help_text="Seconds its preparing has left.")
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # Names are unique among a contributor's active nodes; a retired node frees its name.
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=models.Q(retired_at__isnull=True),
                name="nodes_node_owner_name_unique_active",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.owner_id})"

    @property
    def is_banned(self) -> bool:
        """Node or owner banned. Reads `owner`: select_related it when listing."""
        return self.banned_at is not None or self.owner.banned_at is not None

    @property
    def is_retired(self) -> bool:
        return self.retired_at is not None

    def status_at(self, now: datetime, *, connected: bool | None) -> str:
        """The status at `now`, given whether the node has an open socket (nodes.presence says; None:
        presence is unknown now)."""
        if self.is_banned:
            return NodeStatus.BANNED
        if self.is_retired:
            return NodeStatus.RETIRED
        if connected is None:
            return NodeStatus.UNKNOWN
        if not connected or self.last_seen_at is None:
            return NodeStatus.OFFLINE
        silence = now - self.last_seen_at
        if silence <= ONLINE_WINDOW:
            return NodeStatus.ONLINE
        if silence <= IDLE_WINDOW:
            return NodeStatus.IDLE
        return NodeStatus.OFFLINE


class NodeConnection(models.Model):
    """One open WebSocket of a node: presence kept in the database, when REDIS_URL is unset (with it,
    the same records live in Redis). `expires_at` is renewed by the socket's heartbeat; a server that
    dies stops renewing, so its connections stop counting. See nodes.presence."""

    id = models.UUIDField(primary_key=True, help_text="Chosen by the server for the socket.")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    server = models.CharField(max_length=100, help_text="SAPO_SERVER_NAME of the process holding the socket.")
    # A plain id, not a foreign key: the record lives a minute, and the heartbeat's upsert checks no
    # constraint.
    swarm_id = models.BigIntegerField(
        null=True, blank=True, help_text="The swarm the socket is in (its hello's); null until it is known."
    )
    opened_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["node", "expires_at"], name="nodes_conn_node_expires"),
            models.Index(fields=["expires_at"], name="nodes_conn_expires"),
            models.Index(fields=["server"], name="nodes_conn_server"),
        ]

    def __str__(self) -> str:
        return f"node {self.node_id} on {self.server} until {self.expires_at:%H:%M:%S}"


class NodeToken(models.Model):
    """An API token of a node, stored as the SHA-256 hex of the plaintext (shown once).

    `prefix` is the token's start ("sapo_" + 8 characters), enough to recognise it in a list.
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["node", "revoked_at"], name="nodes_token_node_revoked")]

    def __str__(self) -> str:
        return f"{self.prefix}… (node {self.node_id})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class SocketOrder(models.Model):
    """Something open node sockets must obey: a close (a token revoked, a ban) or a swarm's change (paused,
    retired, edited). Written in the transaction that makes the change (nodes.events.socket_order), so it
    lasts exactly as long as the change: no process stopping and no Redis losing a message can lose it.
    Every server process reads the recent ones (sockets.closes); rows older than a day are deleted."""

    id = models.BigAutoField(primary_key=True)
    # The database's clock (the transaction's start), the one the processes' reads compare with.
    created_at = models.DateTimeField(db_default=Now(), db_index=True)
    #: The channel-layer message the processes deliver (nodes.events.close_event, or a swarm's change).
    event = models.JSONField()

    def __str__(self) -> str:
        return f"socket order {self.id}: {self.event.get('type')}"
