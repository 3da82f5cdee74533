from __future__ import annotations

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from accounts.models import DISPLAY_NAME_MAX_LENGTH, User
from common.errors import ApplicationError


def display_name_is_taken(display_name: str, *, exclude_user_id: int | None = None) -> bool:
    queryset = User.objects.filter(display_name__iexact=display_name)
    if exclude_user_id is not None:
        queryset = queryset.exclude(id=exclude_user_id)
    return queryset.exists()


def _clean_display_name(display_name: str) -> str:
    display_name = " ".join(display_name.split())
    if not display_name:
        raise ApplicationError("invalid_display_name", "A display name is required.")
    if len(display_name) > DISPLAY_NAME_MAX_LENGTH:
        raise ApplicationError(
            "invalid_display_name", f"A display name has at most {DISPLAY_NAME_MAX_LENGTH} characters."
        )
    return display_name


def user_create(*, username: str, display_name: str, password: str | None) -> User:
    """Create a contributor. `password=None` gives an unusable password (accounts made by commands).

    Raises ApplicationError: username_taken, display_name_taken, invalid_display_name, invalid_password.
    """
    display_name = _clean_display_name(display_name)
    user = User(username=User.normalize_username(username), display_name=display_name)
    if password is None:
        user.set_unusable_password()
    else:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise ApplicationError("invalid_password", " ".join(exc.messages)) from exc
        user.set_password(password)
    if User.objects.filter(username__iexact=user.username).exists():
        raise ApplicationError("username_taken", "This username is taken.", status=409)
    if display_name_is_taken(display_name):
        raise ApplicationError("display_name_taken", "This display name is taken.", status=409)
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError as exc:  # a concurrent sign-up won the race
        raise ApplicationError("username_taken", "This username or display name is taken.", status=409) from exc
    return user


def profile_set_private(*, user: User, private: bool) -> User:
    """Make the contributor's public profile private (anonymous everywhere, pages 404 to others) or public."""
    user.profile_private = bool(private)
    user.save(update_fields=["profile_private"])
    return user
