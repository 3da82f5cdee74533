"""The pool: shared rollout groups, their verdicts, and what nodes report and consume.

A `Rollout` is one shared group (question, ground truth, G completions) as a node sent it, with the
server's verdict and the rewards it verified. Rejected groups are kept (the contributor's rejection
inbox) but are never sampleable. `sampleable` is maintained by the services, never computed on read,
so the sampling index stays partial and small.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from sapo_node.ids import uuid7


class Verdict(models.TextChoices):
    ACCEPTED = "accepted", "Accepted"
    REJECTED = "rejected", "Rejected"


class ModerationStatus(models.TextChoices):
    OK = "ok", "OK"
    QUARANTINED = "quarantined", "Quarantined"
    REJECTED = "rejected", "Rejected by a moderator"
    HELD = "held", "Held for review"


class RejectReason(models.TextChoices):
    UNKNOWN_TASK = "unknown_task", "Dataset not in the catalogue"
    BAD_INDEX = "bad_index", "Seed or index out of range"
    QUESTION_MISMATCH = "question_mismatch", "Question does not match its task"
    ANSWER_MISMATCH = "answer_mismatch", "Ground truth does not match its task"
    REWARD_MISMATCH = "reward_mismatch", "A claimed reward differs from the verified one"
    VERIFICATION_TIMEOUT = "verification_timeout", "A completion's scorer ran out of time"
    TASK_WITHDRAWN = "task_withdrawn", "Dataset withdrawn from the swarm's catalogue"
    BUILD_REFUSED = "build_refused", "Dataset too costly to build for a seed the server did not issue"
    HELDOUT_SEED = "heldout_seed", "A question of the held-out stream, which no node may train on"


class AuditState(models.TextChoices):
    """What an accepted group's credit stands on (docs/protocol.md, "Proof of work")."""

    UNAUDITED = "unaudited", "Unaudited (no valid proof of work: no credit)"
    PENDING = "pending", "Pending (valid proof, not yet covered by a passed audit)"
    AUDITED = "audited", "Audited (covered by a passed audit: credited)"
    FAILED = "failed", "Failed (an audit of its node failed over it: no credit)"


class AuditReason(models.TextChoices):
    """Why a group that carried a proof of work is unaudited (pool.challenges)."""

    EXPIRED_CHALLENGE = "expired_challenge", "Its challenge was issued too long before"
    FOREIGN_CHALLENGE = "foreign_challenge", "Its challenge was issued to another node"
    BAD_MAC = "bad_mac", "Its challenge was not issued by this server"
    SEED_NOT_ISSUED = "seed_not_issued", "Its task seed is not its challenge's"
    INDEX_NOT_ISSUED = "index_not_issued", "Its task index is not one of its challenge's"
    REPEATED_QUESTION = "repeated_question", "The node answered this question of the challenge before"
    MODEL_NOT_AUDITABLE = "model_not_auditable", "Its model is not one an audit can rebuild"
    # Not a fault of its proof: the node was held after a failed audit (audits.models.NodeHold). Such a
    # group is stored out of sampling, with or without a proof, and stays out (docs/audits.md).
    NODE_HELD = "node_held", "Its node was held for review after a failed audit"


class RolloutQuerySet(models.QuerySet):
    def with_texts(self) -> RolloutQuerySet:
        """Each group with its texts as `question`, `answer`, `completions` and `proof` (a LEFT JOIN of
        RolloutText on the id and the day, so only the group's day partition is read); all three None
        when the texts aged out (pool.retention), which `completions` alone tells (never NULL when kept)."""
        return self.annotate(
            _texts=models.FilteredRelation("text_rows", condition=Q(text_rows__created_at=models.F("created_at"))),
            question=models.F("_texts__question"),
            answer=models.F("_texts__answer"),
            completions=models.F("_texts__completions"),
            proof=models.F("_texts__proof"),
        )


class Rollout(models.Model):
    # The partition key too: the ledger is range-partitioned by id, a partition per UTC month of UUIDv7
    # ids (pool.retention; docs/architecture.md, "The pool's storage").
    id = models.UUIDField(
        primary_key=True,
        default=uuid7,
        help_text="Chosen by the node (a UUIDv7); idempotency key and partition key.",
    )
    # No index of its own: pool_rollout_node_idx (node, -created_at) serves every lookup by node, and
    # a second index on the same column cost every inserted group one more index entry.
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="rollouts", db_index=False)
    # The column a distributed PostgreSQL would distribute the pool by (docs/architecture.md, "Swarms").
    # No index of its own: the sampling indexes lead with it.
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+", db_index=False)
    catalogue_version = models.PositiveIntegerField(help_text="The swarm's catalogue version it was verified under.")
    round = models.PositiveIntegerField()
    dataset = models.CharField(max_length=64)
    seed = models.BigIntegerField()
    index = models.BigIntegerField()
    # The texts (question, answer, completions) are RolloutText's: kept SAPO_TEXT_RETENTION_DAYS, while
    # this row, the ledger every figure reads, is kept for good (docs/architecture.md, "The pool's storage").
    completion_count = models.PositiveSmallIntegerField()
    claimed_rewards = models.JSONField(help_text="Rewards the node claimed, one per completion.")
    verified_rewards = models.JSONField(
        null=True,
        blank=True,
        help_text="Server re-scores; null if not scored (task not rebuilt, question or answer forged).",
    )
    verdict = models.CharField(max_length=16, choices=Verdict.choices)
    reason = models.CharField(max_length=32, blank=True, choices=RejectReason.choices)
    moderation_status = models.CharField(max_length=16, choices=ModerationStatus.choices, default=ModerationStatus.OK)
    has_variance = models.BooleanField(help_text="Verified rewards not all equal.")
    sampleable = models.BooleanField(help_text="accepted and moderation ok and has_variance; kept by services.")
    sample_seq = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Dense number in its swarm (the swarm's own sequence), given when it first becomes sampleable.",
    )
    # The proof of work's commitment to the generating weights, on the ledger for the audits' queries
    # (the whole proof is RolloutText's, aged out with the texts). NULL: the group carried no proof.
    proof_weights = models.CharField(  # noqa: DJ001 - NULL (no proof) costs a row nothing
        max_length=64, null=True, blank=True, help_text="weights_digest the proof committed to (64 hex)."
    )
    # Defaults in the database too: a row written by raw SQL without them (a restore's, a bench's) is
    # unaudited.
    audit_state = models.CharField(
        max_length=16, choices=AuditState.choices, default=AuditState.UNAUDITED, db_default=AuditState.UNAUDITED
    )
    audit_reason = models.CharField(
        max_length=32,
        blank=True,
        default="",
        db_default="",
        help_text="Why a group with a proof is unaudited (pool.challenges).",
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = RolloutQuerySet.as_manager()

    class Meta:
        indexes = [
            models.Index(
                fields=["swarm", "sample_seq"], condition=Q(sampleable=True), name="pool_rollout_swarm_seq_idx"
            ),
            models.Index(
                fields=["swarm", "created_at"], condition=Q(sampleable=True), name="pool_rollout_swarm_fresh_idx"
            ),
            models.Index(fields=["node", "-created_at"], name="pool_rollout_node_idx"),
            # The few groups under review, by time: what the retention keeps of a day it drops, found
            # without reading the day (pool.retention; it holds the texts table's lock meanwhile).
            models.Index(
                fields=["created_at"],
                condition=Q(moderation_status__in=["held", "quarantined"]),
                name="pool_rollout_review_idx",
            ),
            # The groups that answered a challenge's question (pool.challenges: a node answers each
            # question of a challenge once); only groups with a valid proof have an entry.
            models.Index(
                fields=["node", "seed", "index"],
                condition=~Q(audit_state="unaudited"),
                name="pool_rollout_question_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(sampleable=False)
                | Q(verdict="accepted", moderation_status="ok", has_variance=True, sample_seq__isnull=False),
                name="pool_rollout_sampleable_consistent",
            ),
            models.CheckConstraint(
                condition=Q(verdict="accepted", reason="") | Q(verdict="rejected") & ~Q(reason=""),
                name="pool_rollout_reason_iff_rejected",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset}#{self.index} by node {self.node_id} ({self.verdict})"


class RolloutText(models.Model):
    """A group's texts, apart from its ledger row (Rollout) because they are kept for a while only:
    SAPO_TEXT_RETENTION_DAYS, then dropped or archived (pool.retention). The table is range-partitioned
    by `created_at`, a partition per UTC day and a DEFAULT one: made by migration 0008's SQL (Django
    does not make partitioned tables), read through this model. `created_at` is the group's; the key
    holds it because a unique key of a partitioned table must."""

    pk = models.CompositePrimaryKey("rollout", "created_at")
    # No foreign key in the database: the row is written in the statement that writes its ledger row
    # (pool.ingest_statement), and a check per inserted row would buy nothing more. Django still
    # cascades a node's deletion here.
    rollout = models.ForeignKey(
        Rollout, on_delete=models.CASCADE, related_name="text_rows", db_constraint=False, db_index=False
    )
    swarm = models.ForeignKey(
        "swarms.Swarm", on_delete=models.DO_NOTHING, related_name="+", db_constraint=False, db_index=False
    )
    created_at = models.DateTimeField()
    question = models.TextField()
    # NULL (no single answer, e.g. propositional_logic) differs from an empty answer.
    answer = models.TextField(null=True, blank=True, help_text="Null for tasks without a single answer.")  # noqa: DJ001
    completions = models.JSONField(help_text="List of completion texts, as sent.")
    proof = models.JSONField(null=True, blank=True, help_text="The proof of work as sent (WireProof); null: none.")

    def __str__(self) -> str:
        return f"texts of {self.rollout_id}"


class RetentionDay(models.Model):
    """What the retention job (pool.retention) did with one UTC day's texts: archived to `archive` (empty:
    no archive folder) and dropped at `dropped_at`, `kept` of them (groups under review) moved to the
    DEFAULT partition; or `error`, why it stopped before dropping (shown on /readyz)."""

    day = models.DateField(primary_key=True)
    groups = models.PositiveIntegerField(default=0, help_text="Texts rows the day's partition held.")
    kept = models.PositiveIntegerField(default=0, help_text="Of those, kept (groups under review).")
    archive = models.CharField(max_length=500, blank=True)
    dropped_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"texts of {self.day}: {'dropped' if self.dropped_at else self.error or 'pending'}"


class NodeVerdictCounts(models.Model):
    """How many of a node's groups the verifier accepted and rejected (an id conflict counts as a
    rejection), counted once per group at ingest. Only counts: the node's trust is the moderation app's
    (moderation.trust, docs/moderation.md, "Trust")."""

    node = models.OneToOneField("nodes.Node", on_delete=models.CASCADE, primary_key=True, related_name="verdict_counts")
    accepted_groups = models.PositiveIntegerField(default=0)
    rejected_groups = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "node verdict counts"

    def __str__(self) -> str:
        return f"node {self.node_id}: {self.accepted_groups} accepted, {self.rejected_groups} rejected"


class NodeRound(models.Model):
    """What a node reported about one training round (self-reported; shown as such)."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="rounds")
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+")
    round = models.PositiveIntegerField()
    figures = models.JSONField(default=dict, help_text="reward_mean, reward_std, groups_local, ... as sent.")
    used_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "round"], name="pool_noderound_unique")]

    def __str__(self) -> str:
        return f"node {self.node_id} round {self.round}"


class Consumption(models.Model):
    """A node trained on another node's accepted group: the author's helpfulness credit."""

    consumer = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="consumptions")
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="consumptions")
    author = models.ForeignKey(
        "nodes.Node",
        on_delete=models.CASCADE,
        related_name="consumed_by_others",
        help_text="rollout.node, denormalised.",
    )
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+", help_text="rollout.swarm.")
    round = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["consumer", "rollout"], name="pool_consumption_unique")]
        indexes = [models.Index(fields=["author"], name="pool_consumption_author_idx")]

    def __str__(self) -> str:
        return f"node {self.consumer_id} used {self.rollout_id}"


class ServedGroup(models.Model):
    """A group the pool sent to a node in a `samples` reply. An id in the node's `report.used` earns
    its author helpfulness credit only if the group was served to that node (pool.services
    node_round_report): a node cannot credit groups it never asked for. Rows older than the sampling
    window and a day are pruned (pool.services.rollout_served_record)."""

    pk = models.CompositePrimaryKey("node", "rollout")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+", db_index=False)
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="+")
    served_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["served_at"], name="pool_served_at_idx")]

    def __str__(self) -> str:
        return f"{self.rollout_id} served to node {self.node_id}"


class NodeStorageHour(models.Model):
    """Bytes the pool stored for a node in one hour (groups as stored, round reports): what the
    per-node and per-contributor storage budgets read (docs/protocol.md, "Limits")."""

    pk = models.CompositePrimaryKey("node", "hour")
    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+", db_index=False)
    hour = models.DateTimeField()
    bytes = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"node {self.node_id}, {self.hour:%Y-%m-%d %H}:00: {self.bytes} bytes"


class EpochMarker(models.Model):
    """One row whose PostgreSQL `xmin` and `token` enter the pool's epoch (sockets.epoch): a restore of the
    pool's contents inserts it again. Nothing but sockets.epoch writes it, and only when it is missing."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    token = models.UUIDField(help_text="Random, drawn when the row is made; a row made again draws another.")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="pool_epochmarker_one_row")]

    def __str__(self) -> str:
        return f"epoch marker {self.token}"


class HeldoutScore(models.Model):
    """A node's answers to one held-out check, scored by the swarm's verifiers (sockets.heldout,
    docs/protocol.md, "heldout_check"): questions of the held-out stream no node trains on, answered
    greedily by the node's policy after round `round`. Kept for good, like the ledger."""

    node = models.ForeignKey("nodes.Node", on_delete=models.CASCADE, related_name="+")
    swarm = models.ForeignKey("swarms.Swarm", on_delete=models.PROTECT, related_name="+")
    round = models.PositiveIntegerField(help_text="The node's last round when it answered.")
    questions = models.PositiveSmallIntegerField()
    score = models.FloatField(help_text="Sum of the answers' verified rewards, each in [0, 1].")
    asked_at = models.DateTimeField()
    answered_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["swarm", "answered_at"], name="pool_heldout_swarm_at"),
            models.Index(fields=["node", "answered_at"], name="pool_heldout_node_at"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(score__gte=0) & Q(score__lte=F("questions")), name="pool_heldout_score"),
        ]

    def __str__(self) -> str:
        return f"node {self.node_id} round {self.round}: {self.score:g}/{self.questions}"
