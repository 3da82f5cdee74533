"""The pool's epoch (sockets.epoch): it changes when the marker row is inserted again, as every restore of
the pool's contents does (`pg_restore --clean` into the same database keeps the cluster, its timeline
and the database's OID), and stays the same through what PostgreSQL does to a table meanwhile.

Transactional: each statement commits on its own, as on the site, so a row inserted again has the
xmin of another transaction (within one test transaction both would carry the same one)."""

from __future__ import annotations

import pytest
from django.db import connection

from pool.models import EpochMarker
from sockets.epoch import pool_epoch

pytestmark = pytest.mark.django_db(transaction=True)


def run(statement: str, params: list | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_the_epoch_changes_when_a_restore_inserts_the_marker_row_again() -> None:
    epoch = pool_epoch()
    assert len(epoch) == 16 and pool_epoch() == epoch
    marker = EpochMarker.objects.get()
    # What pg_restore does to the row, in the same database: the same values, by another transaction.
    run("DELETE FROM pool_epochmarker")
    run("INSERT INTO pool_epochmarker (id, token) VALUES (%s, %s)", [marker.id, marker.token])
    assert EpochMarker.objects.get().token == marker.token
    restored = pool_epoch()
    assert restored != epoch
    assert pool_epoch() == restored


def test_vacuum_full_freeze_and_cluster_keep_the_epoch() -> None:
    epoch = pool_epoch()
    run("VACUUM FULL pool_epochmarker")
    run("VACUUM FREEZE pool_epochmarker")
    run("CLUSTER pool_epochmarker USING pool_epochmarker_pkey")
    run("SELECT 1 FROM pool_epochmarker FOR UPDATE")
    assert pool_epoch() == epoch


def test_a_missing_marker_row_is_made_with_a_token_of_its_own() -> None:
    epoch = pool_epoch()
    token = EpochMarker.objects.get().token
    EpochMarker.objects.all().delete()  # how docs/deploy.md has an operator renew the epoch by hand
    renewed = pool_epoch()
    assert renewed != epoch and pool_epoch() == renewed
    assert EpochMarker.objects.count() == 1 and EpochMarker.objects.get().token != token
