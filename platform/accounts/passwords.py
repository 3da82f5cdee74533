"""The longest password the site takes: hashing is the point of a password hash's cost, and its cost
grows with the password (PBKDF2 hashes it once per round): one of a million characters took 0.6 s per
attempt. Refused at sign-up and password changes (this validator, first in AUTH_PASSWORD_VALIDATORS,
and the sign-up form's fields) and at log-in before any hashing (accounts.backends)."""

from __future__ import annotations

from django.contrib.auth import password_validation
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join

#: Characters. Far above any passphrase; far below where hashing one costs a request's worth of CPU.
MAX_PASSWORD_LENGTH = 4096


class MaximumLengthValidator:
    """Django password validator: at most MAX_PASSWORD_LENGTH characters."""

    def __init__(self, max_length: int = MAX_PASSWORD_LENGTH) -> None:
        self.max_length = max_length

    def validate(self, password: str, user: object = None) -> None:
        if len(password) > self.max_length:
            raise ValidationError(
                "This password is too long: at most %(max_length)d characters.",
                code="password_too_long",
                params={"max_length": self.max_length},
            )

    def get_help_text(self) -> str:
        return f"Your password can’t be longer than {self.max_length} characters."


#: Which help texts lead (what a person choosing a password needs first); unlisted validators follow,
#: the maximum length last (no passphrase comes near it).
_HELP_ORDER = ("MinimumLengthValidator", "CommonPasswordValidator", "NumericPasswordValidator")


def _help_rank(validator: object) -> int:
    name = type(validator).__name__
    if isinstance(validator, MaximumLengthValidator):
        return len(_HELP_ORDER) + 1
    return _HELP_ORDER.index(name) if name in _HELP_ORDER else len(_HELP_ORDER)


def password_help_text_html() -> str:
    """The AUTH_PASSWORD_VALIDATORS' help as a list, in the order that matters to a person choosing
    a password: length, not common, not all digits, then the rest (Django lists them in settings order,
    which puts the maximum length first because it must run first)."""
    validators = sorted(password_validation.get_default_password_validators(), key=_help_rank)
    texts = [validator.get_help_text() for validator in validators]
    items = format_html_join("", "<li>{}</li>", ((text,) for text in texts if text))
    return format_html("<ul>{}</ul>", items) if items else ""
