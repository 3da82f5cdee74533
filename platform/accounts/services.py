from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts import events
from accounts.addresses import email_clean
from accounts.models import ANONYMOUS, DISPLAY_NAME_MAX_LENGTH, User
from common import names
from common.errors import ApplicationError

#: The username a deleted account keeps (its own is freed for anyone to take).
DELETED_USERNAME = "deleted-{id}"


def name_is_taken(name: str, *, exclude_user_id: int | None = None) -> bool:
    """Whether another account's display name or username reads as `name` (case and look-alike letters
    aside). Both are compared: a contributor without a display name is shown under the username."""
    queryset = User.objects.filter(
        Q(display_name__iexact=name)
        | Q(username__iexact=name)
        | names.skeleton_filter("display_name_skeleton", name)
        | names.skeleton_filter("username_skeleton", name)
    )
    if exclude_user_id is not None:
        queryset = queryset.exclude(id=exclude_user_id)
    return queryset.exists()


def display_name_is_taken(display_name: str, *, exclude_user_id: int | None = None) -> bool:
    """Whether another account's name reads as `display_name` (`name_is_taken`)."""
    return name_is_taken(display_name, exclude_user_id=exclude_user_id)


def display_name_clean(display_name: object) -> str:
    """The display name with its whitespace collapsed. Raises ApplicationError (field "display_name"):
    invalid_display_name (empty, too long, invisible characters, look-alike scripts: common.names),
    display_name_reserved ("anonymous" in any spelling that looks like it)."""
    display_name = " ".join(str(display_name or "").split())
    field = {"field": "display_name"}
    if not display_name:
        raise ApplicationError("invalid_display_name", "A display name is required.", extra=field)
    if len(display_name) > DISPLAY_NAME_MAX_LENGTH:
        raise ApplicationError(
            "invalid_display_name", f"A display name has at most {DISPLAY_NAME_MAX_LENGTH} characters.", extra=field
        )
    problem = names.name_problem(display_name)
    if problem is not None:
        raise ApplicationError("invalid_display_name", f"The display name {problem}.", extra=field)
    if names.looks_like(display_name, ANONYMOUS):
        raise ApplicationError(
            "display_name_reserved", f"The display name {ANONYMOUS!r} is reserved for private profiles.", extra=field
        )
    return display_name


def username_check_reserved(username: str) -> None:
    """Raises ApplicationError username_reserved for the names deleted accounts keep ("deleted-<id>") and
    "anonymous" in any spelling that looks like it (a contributor without a display name is shown under
    the username)."""
    if username.lower().startswith(DELETED_USERNAME.split("{")[0]):
        raise ApplicationError(
            "username_reserved",
            "Usernames starting with “deleted-” are kept for deleted accounts.",
            extra={"field": "username"},
        )
    if names.looks_like(username, ANONYMOUS):
        raise ApplicationError(
            "username_reserved",
            f"The username {ANONYMOUS!r} is reserved for private profiles.",
            extra={"field": "username"},
        )


def username_clean(username: object) -> str:
    """The username NFKC-normalised (as Django's log-in reads it). Raises ApplicationError (field
    "username"): invalid_username (empty, too long, characters other than letters, digits and @.+-_,
    invisible characters, look-alike scripts: common.names), username_reserved."""
    username = User.normalize_username(str(username or "").strip())
    field = {"field": "username"}
    max_length = User._meta.get_field("username").max_length
    if not username:
        raise ApplicationError("invalid_username", "A username is required.", extra=field)
    if len(username) > max_length:
        raise ApplicationError("invalid_username", f"A username has at most {max_length} characters.", extra=field)
    try:
        User.username_validator(username)
    except ValidationError as exc:
        raise ApplicationError("invalid_username", " ".join(exc.messages), extra=field) from None
    problem = names.name_problem(username)
    if problem is not None:
        raise ApplicationError("invalid_username", f"The username {problem}.", extra=field)
    username_check_reserved(username)
    return username


def user_names_set(*, user: User, username: object, display_name: object) -> User:
    """Check a username and display name as sign-up does and put them, with their look-alike
    fingerprints (common.names.skeleton), on `user`, unsaved: the caller saves it (sign-up, the admin's
    forms, createsuperuser). Every path that names an account comes through here, so every account has
    its fingerprints and no name reads as another account's name.

    Raises ApplicationError: invalid_username, username_reserved, username_taken (409),
    invalid_display_name, display_name_reserved, display_name_taken (409); nothing is changed on `user`.
    """
    username = username_clean(username)
    display_name = display_name_clean(display_name)
    if name_is_taken(username, exclude_user_id=user.pk):
        raise ApplicationError("username_taken", "This username is taken.", status=409, extra={"field": "username"})
    if name_is_taken(display_name, exclude_user_id=user.pk):
        raise ApplicationError(
            "display_name_taken", "This display name is taken.", status=409, extra={"field": "display_name"}
        )
    user.username, user.username_skeleton = username, names.skeleton(username)
    user.display_name, user.display_name_skeleton = display_name, names.skeleton(display_name)
    return user


def user_create(*, username: str, display_name: str, password: str | None, email: str = "") -> User:
    """Create a contributor. `password=None` gives an unusable password (accounts made by commands).
    `email` is optional and unconfirmed (accounts.addresses sends the link).

    Raises ApplicationError: the errors of `user_names_set`, invalid_password, email_invalid.
    """
    user = user_names_set(user=User(), username=username, display_name=display_name)
    user.email = email_clean(email)
    if password is None:
        user.set_unusable_password()
    else:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise ApplicationError("invalid_password", " ".join(exc.messages)) from exc
        user.set_password(password)
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError as exc:  # a concurrent sign-up won the race
        raise ApplicationError("username_taken", "This username or display name is taken.", status=409) from exc
    return user


def profile_set_private(*, user: User, private: bool) -> User:
    """Make the contributor's public profile private (anonymous everywhere, pages 404 to others) or public.
    Turning private withdraws them from what was published about them at once (accounts.events)."""
    with transaction.atomic():
        user.profile_private = bool(private)
        user.save(update_fields=["profile_private"])
        if user.profile_private:
            events.contributor_withdrawn_on_commit(user_id=user.id)
    return user


def user_anonymise(*, user: User) -> User:
    """Empty a deleted account's row: name, username and address freed, profile anonymous, no password,
    no log-in (is_active off ends its sessions: Django logs out an inactive user). The row stays for the
    groups and figures that point to it. What the account held elsewhere (nodes, team, alerts) is the
    caller's (web.account.account_delete), in the same transaction. Withdrawn from published files at once."""
    user.username = DELETED_USERNAME.format(id=user.id)
    user.display_name = user.display_name_skeleton = user.username_skeleton = user.first_name = user.last_name = (
        user.email
    ) = ""
    user.email_confirmed_at = None
    user.profile_private, user.is_active = True, False
    user.set_unusable_password()
    user.deleted_at = timezone.now()
    user.save()
    events.contributor_withdrawn_on_commit(user_id=user.id)
    return user
