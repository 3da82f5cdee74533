"""The longest password the site takes: hashing is the point of a password hash's cost, and its cost
grows with the password (PBKDF2 hashes it once per round): one of a million characters took 0.6 s per
attempt. Refused at sign-up and password changes (this validator, first in AUTH_PASSWORD_VALIDATORS,
and the sign-up form's fields) and at log-in before any hashing (accounts.backends)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

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
