"""The account's email address: one per account, for password resets and, when its owner turns them
on, alerts (alerts reads it). An address is used only once its owner confirmed it by following a
signed link mailed to it (docs/community.md, "Your account")."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.core import signing
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone

from accounts import limits
from accounts.models import User
from common.errors import ApplicationError

CONFIRM_SALT = "accounts.email-confirmation"
#: How long a confirmation link works.
CONFIRM_MAX_AGE = timedelta(hours=48)
EMAIL_MAX_LENGTH = 254


def email_clean(email: object) -> str:
    """The address stripped ("" for none). Raises ApplicationError email_invalid (field "email")."""
    email = str(email or "").strip()
    if not email:
        return ""
    try:
        if len(email) > EMAIL_MAX_LENGTH:
            raise ValidationError("too long")
        validate_email(email)
    except ValidationError as exc:
        raise ApplicationError(
            "email_invalid", "Enter a valid email address, or leave it empty.", extra={"field": "email"}
        ) from exc
    return User.objects.normalize_email(email)


def confirmation_text(link: str) -> tuple[str, str]:
    """(subject, body) of the confirmation email: nothing in it comes from the account that asked."""
    hours = int(CONFIRM_MAX_AGE.total_seconds() // 3600)
    return (
        "[SAPO Swarm] Confirm your email address",
        "Someone with an account on SAPO Swarm gave this address for it: for password resets and, if they "
        f"turn them on, alerts about their nodes. To confirm it, open this link within {hours} hours:\n\n{link}\n\n"
        "If it was not you, ignore this email: nothing more is sent to this address unless the link is followed.",
    )


def user_email_set(*, user: User, email: str, confirm_link: Callable[[str], str] | None, network: str) -> bool:
    """Set the account's address (empty: none). A new address is unconfirmed, and a link goes to it when
    `confirm_link` is given and the limits allow. Returns whether a link went now.
    Raises ApplicationError email_invalid; nothing is stored then."""
    email = email_clean(email)
    if email == user.email:
        return False
    with transaction.atomic():
        user.email, user.email_confirmed_at = email, None
        user.save(update_fields=["email", "email_confirmed_at"])
    if not email or confirm_link is None:
        return False
    try:
        user_email_confirmation_send(user=user, confirm_link=confirm_link, network=network)
    except ApplicationError:  # over a limit: saved all the same; /me/ offers to send the link again
        return False
    return True


def user_email_confirmation_send(*, user: User, confirm_link: Callable[[str], str], network: str) -> None:
    """Mail a confirmation link to the account's unconfirmed address. Raises ApplicationError (no_email,
    already_confirmed) or RateLimited confirmation_limited (accounts.limits.confirmation_consume)."""
    if not user.email:
        raise ApplicationError("no_email", "Set an email address first.", extra={"field": "email"})
    if user.email_confirmed_at is not None:
        raise ApplicationError("already_confirmed", "This address is confirmed already.")
    limits.confirmation_consume(user_id=user.id, email=user.email, network=network)
    token = signing.dumps({"u": user.pk, "e": user.email}, salt=CONFIRM_SALT)
    subject, body = confirmation_text(confirm_link(token))
    send_mail(subject, body, None, [user.email], fail_silently=False)


def user_email_confirmation_read(*, token: str) -> User:
    """The account a confirmation token is for, while it is valid and the address unchanged.
    Raises ApplicationError: confirmation_expired, confirmation_invalid."""
    try:
        data = signing.loads(token, salt=CONFIRM_SALT, max_age=CONFIRM_MAX_AGE)
    except signing.SignatureExpired as exc:
        raise ApplicationError(
            "confirmation_expired", "This confirmation link has expired: send a new one from your page."
        ) from exc
    except signing.BadSignature as exc:
        raise ApplicationError("confirmation_invalid", "This confirmation link is not valid.") from exc
    user = None
    if isinstance(data, dict) and isinstance(data.get("u"), int) and isinstance(data.get("e"), str) and data["e"]:
        user = User.objects.filter(id=data["u"], email=data["e"], is_active=True).first()
    if user is None:
        raise ApplicationError(
            "confirmation_invalid", "This confirmation link is for an address no longer set: nothing to confirm."
        )
    return user


def user_email_confirm(*, token: str) -> User:
    """Confirm the address the token names (see user_email_confirmation_read)."""
    user = user_email_confirmation_read(token=token)
    if user.email_confirmed_at is None:
        user.email_confirmed_at = timezone.now()
        user.save(update_fields=["email_confirmed_at"])
    return user
