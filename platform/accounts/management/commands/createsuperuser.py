"""Django's createsuperuser, with the account named as sign-up names one (accounts.services.user_names_set):
the same checks of the username and display name, and their look-alike fingerprints written."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.management.commands import createsuperuser
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.db.models import Max

from accounts.models import User
from accounts.services import user_names_set, username_clean
from common.errors import ApplicationError


class Command(createsuperuser.Command):
    def _validate_username(self, username: str, verbose_field_name: str, database: str) -> str | None:
        # Asked before the other fields, so a refused username is said at once (a prompt asks again).
        error = super()._validate_username(username, verbose_field_name, database)
        if error:
            return error
        try:
            username_clean(username)
        except ApplicationError as exc:
            return f"Error: {exc.message}"
        return None

    def handle(self, *args: Any, **options: Any) -> None:
        # Django's command saves the row; the service then checks both names against every other
        # account and writes the fingerprints, in the same transaction: a refusal stores nothing.
        database = options["database"]
        users = User.objects.using(database)
        try:
            with transaction.atomic(using=database):
                last_id = users.aggregate(last=Max("id"))["last"] or 0
                super().handle(*args, **{**options, "verbosity": 0})  # it says "created" before the check
                for user in users.filter(id__gt=last_id, is_superuser=True):
                    user_names_set(user=user, username=user.username, display_name=user.display_name)
                    user.save(using=database)
        except ApplicationError as exc:
            raise CommandError(f"{exc.message} ({exc.code})") from exc
        except IntegrityError as exc:  # the display name's case-insensitive uniqueness (accounts.models)
            raise CommandError("This display name is taken. (display_name_taken)") from exc
        if options["verbosity"] >= 1:
            self.stdout.write("Superuser created successfully.")
