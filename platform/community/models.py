"""Teams, their membership periods, and badges (docs/community.md#teams, #badges).

A team's credit is what its members earned *while members*: a `Membership` row is one period
(joined_at, left_at), never deleted, so the figures (figures.teams) can count each period's hours and
nothing else. One open period per contributor: at most one team at a time.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

TEAM_NAME_MAX_LENGTH = 40
TEAM_NAME_MIN_LENGTH = 3
TEAM_DESCRIPTION_MAX_LENGTH = 280
TEAM_URL_MAX_LENGTH = 200


class Team(models.Model):
    """A team of contributors. `founder` holds the team's rights (edit, hand over, disband); the
        founder can hand them to another member. Staff can rename (which locks the name) or hide a team
    (audited)."""

    name = models.CharField(max_length=TEAM_NAME_MAX_LENGTH)
    name_skeleton = models.CharField(
        max_length=10 * TEAM_NAME_MAX_LENGTH,
        blank=True,
        db_index=True,
        help_text="The name's confusable skeleton (common.names): no two teams in the lists share one.",
    )
    name_locked_at = models.DateTimeField(
        null=True, blank=True, help_text="Renamed by staff: the founder can no longer change the name."
    )
    slug = models.SlugField(max_length=64, unique=True, help_text="The team's address: /teams/<slug>/. Never reused.")
    description = models.CharField(max_length=TEAM_DESCRIPTION_MAX_LENGTH, blank=True)
    url = models.CharField(max_length=TEAM_URL_MAX_LENGTH, blank=True, help_text="An http(s) address (community.text).")
    founder = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="teams_led")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Who founded it (the founder may change hands): the per-account limit counts these.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    hidden_at = models.DateTimeField(null=True, blank=True, help_text="Hidden by staff: off every public list.")
    disbanded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                Lower("name"),
                name="community_team_name_ci_unique",
                condition=models.Q(disbanded_at__isnull=True),
                violation_error_message="A team with this name exists.",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_listed(self) -> bool:
        return self.hidden_at is None and self.disbanded_at is None


class Membership(models.Model):
    """One period of a contributor in a team: open while `left_at` is null."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    joined_at = models.DateTimeField(default=timezone.now)
    left_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user"], condition=models.Q(left_at__isnull=True), name="community_one_team_at_a_time"
            ),
            models.CheckConstraint(
                condition=models.Q(left_at__isnull=True) | models.Q(left_at__gte=models.F("joined_at")),
                name="community_membership_period_in_order",
            ),
        ]
        indexes = [models.Index(fields=["team", "left_at"], name="community_membership_team_idx")]

    def __str__(self) -> str:
        return f"user {self.user_id} in team {self.team_id}"


class BadgeKind(models.TextChoices):
    TOP_1 = "top1", "Top 1%"
    TOP_5 = "top5", "Top 5%"
    TOP_25 = "top25", "Top 25%"
    FIRST_GROUP = "first_group", "First accepted group"
    GROUPS_1K = "groups_1k", "1,000 accepted groups"
    GROUPS_10K = "groups_10k", "10,000 accepted groups"
    FIRST_HELPED = "first_helped", "Helped another contributor"


#: Rank badges, best first: recomputed on every run (a subject holds at most one of them).
RANK_BADGES = (BadgeKind.TOP_1, BadgeKind.TOP_5, BadgeKind.TOP_25)
#: Milestones: awarded once, kept for good.
MILESTONE_BADGES = (BadgeKind.FIRST_GROUP, BadgeKind.GROUPS_1K, BadgeKind.GROUPS_10K, BadgeKind.FIRST_HELPED)


class Badge(models.Model):
    """A badge held by a contributor or a team (exactly one of them), assigned by the scheduled job."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True, related_name="badges"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, null=True, blank=True, related_name="badges")
    kind = models.CharField(max_length=16, choices=BadgeKind.choices)
    #: Earned on the figures of one swarm (a rank badge there); none: on the whole site's.
    swarm = models.ForeignKey(
        "swarms.Swarm", on_delete=models.CASCADE, null=True, blank=True, related_name="+", db_index=False
    )
    awarded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(user__isnull=True) ^ models.Q(team__isnull=True), name="community_badge_one_holder"
            ),
            models.UniqueConstraint(
                fields=["user", "kind"],
                condition=models.Q(user__isnull=False, swarm__isnull=True),
                name="community_badge_user_unique",
            ),
            models.UniqueConstraint(
                fields=["team", "kind"],
                condition=models.Q(team__isnull=False, swarm__isnull=True),
                name="community_badge_team_unique",
            ),
            models.UniqueConstraint(
                fields=["user", "kind", "swarm"],
                condition=models.Q(user__isnull=False, swarm__isnull=False),
                name="community_badge_user_swarm_unique",
            ),
            models.UniqueConstraint(
                fields=["team", "kind", "swarm"],
                condition=models.Q(team__isnull=False, swarm__isnull=False),
                name="community_badge_team_swarm_unique",
            ),
        ]

    def __str__(self) -> str:
        holder = f"user {self.user_id}" if self.user_id else f"team {self.team_id}"
        return f"{self.kind} of {holder}" + (f" in swarm {self.swarm_id}" if self.swarm_id else "")
