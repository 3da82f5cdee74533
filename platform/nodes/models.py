from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

NODE_NAME_MAX_LENGTH = 64

#: A connected node that sent something within this window is "online"; quieter but connected
#: nodes are "idle".
ONLINE_WINDOW = timedelta(minutes=2)
#: Past this silence a node counts as "offline" even if `connections` says otherwise: the counter
#: may be stale after a server crash (disconnects that never ran).
IDLE_WINDOW = timedelta(hours=1)


class NodeStatus(models.TextChoices):
    ONLINE = "online", "Online"
    IDLE = "idle", "Idle"
    OFFLINE = "offline", "Offline"
    BANNED = "banned", "Banned"
    RETIRED = "retired", "Retired"


class Node(models.Model):
    """A contributor's compute node. Its status is derived, never stored:

    - banned:  `banned_at` is set on the node or on its owner;
    - retired: `retired_at` is set (tokens revoked, kept for history);
    - online:  `connections` > 0 (open WebSockets, counted by the consumer through
               node_mark_connected/node_mark_disconnected) and seen within ONLINE_WINDOW;
    - idle:    connected but quiet for longer, up to IDLE_WINDOW;
    - offline: otherwise.
    """

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=NODE_NAME_MAX_LENGTH)
    model_id = models.CharField(max_length=200, blank=True, help_text="Model the node trains (self-reported).")
    hardware = models.CharField(max_length=200, blank=True, help_text="Self-reported hardware description.")
    client_version = models.CharField(max_length=64, blank=True)
    connections = models.PositiveIntegerField(default=0, help_text="Open WebSocket connections.")
    last_seen_at = models.DateTimeField(null=True, blank=True)
    banned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)

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

    def status_at(self, now: datetime) -> str:
        if self.is_banned:
            return NodeStatus.BANNED
        if self.is_retired:
            return NodeStatus.RETIRED
        if self.connections <= 0 or self.last_seen_at is None:
            return NodeStatus.OFFLINE
        silence = now - self.last_seen_at
        if silence <= ONLINE_WINDOW:
            return NodeStatus.ONLINE
        if silence <= IDLE_WINDOW:
            return NodeStatus.IDLE
        return NodeStatus.OFFLINE

    @property
    def status(self) -> str:
        return self.status_at(timezone.now())


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
