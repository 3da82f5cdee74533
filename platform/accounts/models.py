from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models.functions import Lower

DISPLAY_NAME_MAX_LENGTH = 40
#: The name every public page and export shows for a contributor whose profile is private.
ANONYMOUS = "anonymous"


class User(AbstractUser):
    """A contributor. `display_name` is public (leaderboard, pool authorship); `username` is for login.

    `banned_at` set: the contributor's nodes are refused (close code 4403) and their groups leave
    the pool; the account itself can still log in to see why.

    `profile_private` set: every public page, row and export names the contributor "anonymous", and
    their public pages answer 404 to everyone else (docs/community.md#public-pages).

    `deleted_at` set: the account was deleted; the row is anonymous and can no longer log in.
    """

    display_name = models.CharField(
        max_length=DISPLAY_NAME_MAX_LENGTH,
        blank=True,
        help_text="Public name shown on the leaderboard. Unique, case-insensitively.",
    )
    display_name_skeleton = models.CharField(
        max_length=10 * DISPLAY_NAME_MAX_LENGTH,
        blank=True,
        db_index=True,
        help_text="The display name's confusable skeleton (common.names): no two accounts share one.",
    )
    username_skeleton = models.CharField(
        max_length=10 * 150,
        blank=True,
        db_index=True,
        help_text="The username's confusable skeleton (common.names): no name of another account reads the same.",
    )
    banned_at = models.DateTimeField(null=True, blank=True)
    #: When the owner of `email` followed the link sent to it (accounts.services); None: unconfirmed, and
    #: nothing but that link goes to it (no reset link, no alert).
    email_confirmed_at = models.DateTimeField(null=True, blank=True)
    profile_private = models.BooleanField(
        default=False, help_text='Shown as "anonymous" to others; public pages answer 404 to them.'
    )
    #: When its owner deleted the account (web.account): the row stays, emptied and anonymous, so the
    #: groups its nodes shared and the swarm's figures stay whole (docs/community.md, "Your account").
    deleted_at = models.DateTimeField(null=True, blank=True)

    #: createsuperuser asks for a display name (DJANGO_SUPERUSER_DISPLAY_NAME without a prompt): every
    #: account is named through accounts.services.user_names_set (accounts.management.commands.createsuperuser).
    REQUIRED_FIELDS = ["email", "display_name"]

    class Meta:
        constraints = [
            models.UniqueConstraint(
                Lower("display_name"),
                name="accounts_user_display_name_ci_unique",
                condition=~models.Q(display_name=""),
                violation_error_message="This display name is taken.",
            )
        ]

    def __str__(self) -> str:
        return self.username

    @property
    def own_name(self) -> str:
        """The name the contributor chose: the display name, or the username when none was chosen."""
        return self.display_name or self.username

    @property
    def public_name(self) -> str:
        """What other people see: the contributor's own name, or "anonymous" for a private profile."""
        return ANONYMOUS if self.profile_private else self.own_name

    @property
    def is_banned(self) -> bool:
        return self.banned_at is not None


class LimitCounter(models.Model):
    """One abuse-limit counter (accounts.limits) when the deployment has no Redis: `count` hits in
    the window that closes at `expires_at`. Rows of closed windows are swept as new ones open."""

    key = models.CharField(max_length=100, unique=True)
    count = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.count}"
