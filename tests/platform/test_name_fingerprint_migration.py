"""Migration accounts 0007: every account made before it (by the admin or createsuperuser too) gets
its username's and display name's look-alike fingerprints, so sign-ups cannot imitate it."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts.services import user_create
from common import names
from common.errors import ApplicationError

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("accounts", "0006_user_deleted_at")]
AFTER = [("accounts", "0007_name_fingerprints")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def test_accounts_without_fingerprints_get_them():
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            # As the admin's forms and createsuperuser stored accounts: names, no fingerprint.
            cursor.execute(
                "INSERT INTO accounts_user (password, is_superuser, username, first_name, last_name, email,"
                " is_staff, is_active, date_joined, display_name, display_name_skeleton, profile_private, deleted_at)"
                " VALUES ('!', true, 'Sam', '', '', '', true, true, now(), 'Sam Staff', '', false, NULL),"
                " ('!', false, 'deleted-9', '', '', '', false, false, now(), '', '', true, now())"
            )
        _migrate(AFTER)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT username, username_skeleton, display_name_skeleton FROM accounts_user ORDER BY username"
            )
            rows = cursor.fetchall()
        assert ("Sam", names.skeleton("Sam"), names.skeleton("Sam Staff")) in rows
        assert ("deleted-9", "", "") in rows
        with pytest.raises(ApplicationError) as info:
            user_create(username="imitator", display_name="\uff33am Staff", password=None)  # fullwidth S
        assert info.value.code == "display_name_taken"
    finally:
        _migrate(AFTER)
