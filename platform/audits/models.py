"""An audit of a node's weights, the groups it covers, the draws that chose it, and the hold a
failed audit puts on its node (docs/audits.md)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditState(models.TextChoices):
    REQUESTED = "requested", "Requested"  # waiting for the node's upload
    UPLOADED = "uploaded", "Uploaded"  # the whole file is in, its hash checked; queued for the worker
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"  # no upload by the deadline: counts as failed
    # Its job failed SAPO_AUDIT_JOB_ATTEMPTS times (an exception, a worker lost): the site's fault, not
    # the node's. Its groups stay pending for a later audit; no hold.
    ERRORED = "errored", "Errored"

    @classmethod
    def open(cls) -> tuple[str, ...]:
        return (cls.REQUESTED.value, cls.UPLOADED.value)


class Audit(models.Model):
    """One weights digest of one node, asked for and replayed. The upload's columns describe the file
    as it arrives (bytes so far, announced total, the sha256 the last chunk named)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="audits")
    weights = models.CharField(max_length=64, db_collation="C", help_text="proof.weights_digest committed to.")
    model = models.CharField(max_length=200, help_text="The model family the groups' proof names.")
    state = models.CharField(max_length=16, choices=AuditState.choices, default=AuditState.REQUESTED)
    reason = models.TextField(
        blank=True, help_text="Why it failed, expired or errored (shown to the contributor and staff)."
    )
    requested_at = models.DateTimeField(default=timezone.now)
    deadline = models.DateTimeField()
    upload_path = models.CharField(max_length=500, blank=True)
    upload_size = models.BigIntegerField(default=0, help_text="Bytes received so far.")
    upload_total = models.BigIntegerField(null=True, blank=True, help_text="Bytes the upload announced.")
    upload_sha256 = models.CharField(max_length=64, blank=True)
    uploaded_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True, help_text="When its job was last queued.")
    started_at = models.DateTimeField(null=True, blank=True, help_text="When a job last claimed it.")
    attempts = models.PositiveSmallIntegerField(default=0, help_text="Jobs started for it.")
    finished_at = models.DateTimeField(null=True, blank=True)
    cpu_seconds = models.FloatField(null=True, blank=True)
    groups_replayed = models.PositiveIntegerField(default=0)
    tokens_replayed = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [
            models.Index(fields=["node", "-requested_at"], name="audits_node_idx"),
            models.Index(
                fields=["state", "deadline"], name="audits_open_idx", condition=models.Q(state__in=AuditState.open())
            ),
            # The few errored audits, for the ops gauge (ops.collectors) without reading every audit.
            models.Index(
                fields=["finished_at"], name="audits_errored_idx", condition=models.Q(state=AuditState.ERRORED)
            ),
        ]
        constraints = [
            # One open audit per digest of a node: the ingest adds new groups of that digest to it.
            models.UniqueConstraint(
                fields=["node", "weights"], condition=models.Q(state__in=AuditState.open()), name="audits_one_open"
            ),
            models.CheckConstraint(condition=models.Q(state__in=AuditState.values), name="audits_state_valid"),
        ]

    def __str__(self) -> str:
        return f"audit {self.id} of node {self.node_id} ({self.state})"


class AuditGroup(models.Model):
    """A group an audit covers: one of its node's groups committed to the audited digest."""

    audit = models.ForeignKey(Audit, on_delete=models.CASCADE, related_name="group_rows")
    rollout = models.ForeignKey("pool.Rollout", on_delete=models.CASCADE, related_name="+")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["audit", "rollout"], name="audits_group_unique")]

    def __str__(self) -> str:
        return f"{self.rollout_id} in {self.audit_id}"


class AuditDraw(models.Model):
    """A draw for a batch of a node's new groups under a weights digest no open audit covers: whether
    that digest is audited. Every such batch is drawn, so a node told its digest was spared cannot then
    add made-up groups under it unchecked; a resend inserts nothing and draws nothing."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+")
    weights = models.CharField(max_length=64, db_collation="C")
    probability = models.FloatField()
    chosen = models.BooleanField()
    drawn_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"draw {self.weights[:12]} of node {self.node_id}: {self.chosen}"


class NodeHold(models.Model):
    """A node held for staff review after a failed audit: its new groups are stored unaudited (no
    credit, never pending) until staff release it."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="audit_holds")
    audit = models.ForeignKey(Audit, on_delete=models.CASCADE, related_name="+")
    reason = models.TextField()
    held_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node"], condition=models.Q(released_at__isnull=True), name="audits_one_hold"
            )
        ]

    def __str__(self) -> str:
        return f"hold of node {self.node_id}"


class AuditBase(models.Model):
    """A public base model's weights as an audit worker of this site holds them: the digest a checkpoint
    uploaded as a difference must name (sapo_node.weightdiff). Recorded by the worker whenever it builds
    a model from the site's copy, so until a worker has built one, its nodes upload whole checkpoints."""

    model = models.CharField(max_length=200)
    digest = models.CharField(max_length=64, db_collation="C", help_text="weights_digest of the base in float32.")
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "digest"], name="audits_base_unique")]

    def __str__(self) -> str:
        return f"{self.model} base {self.digest[:12]}"
