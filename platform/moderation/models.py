"""Moderation: the audit log, the switchable automatic rules, per-group decisions and flags, node trust.

The pool owns `Rollout.moderation_status` and `sampleable`; this app records *why* a group has the
status it has (`ModerationDecision`), which automatic rule noticed it (`ModerationFlag`), who did what
(`AuditEntry`, append-only) and how far each node is trusted (`TrustRecord`).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Length, Mod
from django.db.models.lookups import Exact
from django.utils import timezone

REASON_MAX_LENGTH = 500


class AuditAction(models.TextChoices):
    QUARANTINE = "quarantine", "Quarantine"
    RESTORE = "restore", "Restore"
    REJECT = "reject", "Reject"
    BAN_NODE = "ban_node", "Ban node"
    UNBAN_NODE = "unban_node", "Unban node"
    BAN_CONTRIBUTOR = "ban_contributor", "Ban contributor"
    UNBAN_CONTRIBUTOR = "unban_contributor", "Unban contributor"
    AUTO_VERDICT = "auto_verdict", "Automatic verdict"
    AUTO_FLAG = "auto_flag", "Automatic flag"
    AUTO_HOLD = "auto_hold", "Automatic hold"
    RULE_CHANGE = "rule_change", "Rule changed"
    FLAG_RESOLVE = "flag_resolve", "Flag resolved"
    TEAM_RENAME = "team_rename", "Rename team"
    TEAM_HIDE = "team_hide", "Hide team"
    TEAM_SHOW = "team_show", "Show team again"
    SWARM_CREATE = "swarm_create", "Create swarm"
    SWARM_EDIT = "swarm_edit", "Edit swarm"
    SWARM_CATALOGUE = "swarm_catalogue", "New catalogue version"
    SWARM_OPEN = "swarm_open", "Open swarm"
    SWARM_PAUSE = "swarm_pause", "Pause swarm"
    SWARM_RETIRE = "swarm_retire", "Retire swarm"


class TargetType(models.TextChoices):
    ROLLOUT = "rollout", "Group"
    ROLLOUT_FILTER = "rollout_filter", "Groups matching a filter"
    NODE = "node", "Node"
    CONTRIBUTOR = "contributor", "Contributor"
    RULE = "rule", "Rule"
    TEAM = "team", "Team"
    SWARM = "swarm", "Swarm"


class AuditEntryQuerySet(models.QuerySet):
    def update(self, **kwargs):  # noqa: ANN003 - mirrors QuerySet.update
        raise PermissionError("the audit log is append-only")

    def delete(self):
        raise PermissionError("the audit log is append-only")


class AuditEntry(models.Model):
    """One moderation action or automatic verdict. Append-only: the model refuses updates and deletes
    and a PostgreSQL trigger (migration 0001) refuses UPDATE and DELETE on the table, whatever the client.

    Who: `actor` (a staff user) or `rule` (an automatic rule's key), exactly one of them.
    What: `action` on `target_type`/`target_id`, `count` rows affected (bulk actions: the filter is in
    `details`). Why: `reason`.
    """

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    rule = models.CharField(max_length=32, blank=True)
    action = models.CharField(max_length=32, choices=AuditAction.choices)
    target_type = models.CharField(max_length=16, choices=TargetType.choices)
    target_id = models.CharField(max_length=64, blank=True)
    count = models.PositiveIntegerField(default=1)
    reason = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["target_type", "target_id"], name="moderation_audit_target_idx"),
            models.Index(fields=["action", "-created_at"], name="moderation_audit_action_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(actor__isnull=False) & models.Q(rule=""))
                | (models.Q(actor__isnull=True) & ~models.Q(rule="")),
                name="moderation_audit_actor_xor_rule",
            )
        ]

    def __str__(self) -> str:
        who = f"user {self.actor_id}" if self.actor_id else f"rule {self.rule}"
        return f"{self.created_at:%Y-%m-%d %H:%M:%S} {who} {self.action} {self.target_type}:{self.target_id}"

    def save(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        if not self._state.adding:
            raise PermissionError("the audit log is append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):  # noqa: ANN002, ANN003
        raise PermissionError("the audit log is append-only")


class RuleAction(models.TextChoices):
    FLAG = "flag", "Flag only (stays sampleable)"
    HOLD = "hold", "Hold for review (not sampled until a moderator decides)"


class ModerationRule(models.Model):
    """One automatic rule or trust setting, switched and tuned by staff at run time (moderation.rules).

    `params` hold the rule's knobs; their names, types and bounds are in moderation.rules.RULES.
    `swarm` empty: the site's rule, applied to every share; set: a rule of that swarm only, applied to
    its shares besides the site's (the keys RuleSpec.per_swarm allows). One row per key and swarm.
    """

    key = models.CharField(max_length=32)
    swarm = models.ForeignKey(
        "swarms.Swarm", on_delete=models.CASCADE, null=True, blank=True, related_name="moderation_rules"
    )
    enabled = models.BooleanField(default=True)
    action = models.CharField(max_length=8, choices=RuleAction.choices, default=RuleAction.HOLD)
    params = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["key", "swarm_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["key"], condition=models.Q(swarm__isnull=True), name="moderation_rule_site_key"
            ),
            models.UniqueConstraint(
                fields=["swarm", "key"], condition=models.Q(swarm__isnull=False), name="moderation_rule_swarm_key"
            ),
        ]

    def __str__(self) -> str:
        where = f" in swarm {self.swarm_id}" if self.swarm_id else ""
        return f"{self.key}{where} ({'on' if self.enabled else 'off'}, {self.action})"


class ModerationDecision(models.Model):
    """Why a group has its current moderation status: the latest decision, by a moderator or a rule.

    `batch` names the action that wrote it (one per single or bulk action), so a bulk action can
    address exactly the groups it decided on in one UPDATE.
    """

    rollout = models.OneToOneField(
        "pool.Rollout", on_delete=models.CASCADE, primary_key=True, related_name="moderation_decision"
    )
    status = models.CharField(max_length=16)
    reason = models.TextField(blank=True)
    rule = models.CharField(max_length=32, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    batch = models.UUIDField(default=uuid.uuid4, db_index=True)
    decided_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.rollout_id}: {self.status} ({self.rule or self.actor_id})"


class ModerationFlag(models.Model):
    """An automatic rule noticed something: on a group (`rollout` set) or on a node (outliers)."""

    rollout = models.ForeignKey(
        "pool.Rollout", on_delete=models.CASCADE, null=True, blank=True, related_name="moderation_flags"
    )
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="moderation_flags")
    rule = models.CharField(max_length=32)
    detail = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["rule", "rollout"], name="moderation_flag_rule_idx"),
            models.Index(
                fields=["node", "rule"], condition=models.Q(resolved_at__isnull=True), name="moderation_flag_open_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.rule} on {self.rollout_id or f'node {self.node_id}'}"


class RolloutFingerprint(models.Model):
    """What the duplicate rules compare: per completion, the hash of its normalised text (exact copies)
    and its 64-bit simhash (near copies), for accepted groups only. Both are bytes, the completions'
    fingerprints concatenated in order (moderation.filters.Fingerprint): `exact` 16 bytes each (BLAKE2b),
    `simhash` 8 each (big-endian, signed: PostgreSQL's int8send). The screening query hands them to the
    rules as they are (migration 0003; they were JSON lists before)."""

    rollout = models.OneToOneField(
        "pool.Rollout", on_delete=models.CASCADE, primary_key=True, related_name="+", db_constraint=False
    )
    # A node's fingerprints go with its groups (the rollout's CASCADE, by primary key): no index of their
    # own to keep up on every insert. The hashes are hex, compared byte by byte (collation "C"): no
    # locale's rules in the index on every insert and lookup (migration 0005).
    node = models.ForeignKey(
        "nodes.Node", on_delete=models.DO_NOTHING, related_name="+", db_constraint=False, db_index=False
    )
    question_hash = models.CharField(max_length=40, db_collation="C")
    exact = models.BinaryField(default=bytes)
    simhash = models.BinaryField(default=bytes)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["question_hash", "-created_at"], name="moderation_fp_question_idx")]
        constraints = [
            # One 16-byte digest per 8-byte simhash: the screening reads the candidates' completions by
            # these sizes (moderation.filters.CopyIndex).
            models.CheckConstraint(
                condition=models.Q(Exact(Length("exact"), Length("simhash") * 2), Exact(Mod(Length("simhash"), 8), 0)),
                name="moderation_fp_sizes",
            )
        ]

    def __str__(self) -> str:
        return f"fingerprint of {self.rollout_id}"


class TrustRecord(models.Model):
    """A node's trust (docs/moderation.md, "Trust"): trust = (streak + 1) / (streak + 1 + half_streak),
    `streak` = accepted groups since the node's last rejected one (by the verifier or a moderator)."""

    node = models.OneToOneField("nodes.Node", on_delete=models.CASCADE, primary_key=True, related_name="trust_record")
    streak = models.PositiveIntegerField(default=0)
    accepted = models.PositiveIntegerField(default=0)
    rejected = models.PositiveIntegerField(default=0)
    last_rejected_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"node {self.node_id}: streak {self.streak}"
