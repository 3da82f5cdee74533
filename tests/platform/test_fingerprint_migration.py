"""Migration moderation 0003: the stored fingerprints move from JSON lists to bytes (and back), each
completion's fingerprint where it was, so the duplicate rules find the same copies after an upgrade."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from moderation import filters

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = ("moderation", "0002_fingerprint_no_db_constraints")
AFTER = ("moderation", "0003_fingerprint_bytes")


def _migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


def _migrate_to_latest() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("moderation"))


def _insert(rollout_id: uuid.UUID, exact: object, simhash: object) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO moderation_rolloutfingerprint (rollout_id, node_id, question_hash, exact, simhash, created_at)"
            " VALUES (%s, 1, 'q', %s::jsonb, %s::jsonb, now())",
            [rollout_id, json.dumps(exact), json.dumps(simhash)],
        )


def _stored() -> dict[uuid.UUID, tuple[object, object]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT rollout_id, exact, simhash FROM moderation_rolloutfingerprint")
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


def test_fingerprints_convert_to_bytes_in_order_and_back():
    texts = ["the first completion, long enough to matter", "a second one", "Ünïcode and <answer>7</answer>"]
    fp = filters.fingerprints([texts])[0]
    hashes = [*fp.simhash[:2], -(2**63), 2**63 - 1]  # the extremes: the sign and the byte order matter
    digests = [*fp.exact, bytes(range(16))]
    good, empty, bad_hex, bad_count, too_big = (uuid.uuid4() for _ in range(5))
    _migrate(BEFORE)
    try:
        _insert(good, [d.hex() for d in digests], hashes)
        _insert(empty, [], [])
        _insert(bad_hex, ["not a digest"], [1])
        _insert(bad_count, [digests[0].hex()], [1, 2])
        _insert(too_big, [digests[0].hex()], [2**64])
        _migrate(AFTER)
        stored = _stored()
        assert set(stored) == {good, empty}  # what the rules never wrote is dropped
        exact, simhash = (bytes(v) for v in stored[good])
        assert exact == b"".join(digests)
        assert simhash == filters.simhash_bytes(hashes)
        index = filters.CopyIndex(good.bytes, [len(hashes)], exact, simhash)
        assert index.exact_matches([digests[1], bytes(16)]) == [str(good), None]
        assert index.near_matches([hashes[2] ^ 0b101, hashes[3]], 3) == [str(good), str(good)]
        assert [bytes(v) for v in stored[empty]] == [b"", b""]
        _migrate(BEFORE)
        assert [json.loads(v) for v in _stored()[good]] == [[d.hex() for d in digests], hashes]
    finally:
        _migrate_to_latest()


def test_the_database_refuses_fingerprints_of_mismatched_sizes():
    """One 16-byte digest per 8-byte simhash, or the screening could not read the candidates apart."""
    insert = (
        "INSERT INTO moderation_rolloutfingerprint (rollout_id, node_id, question_hash, exact, simhash, created_at)"
        " VALUES (%s, 1, 'q', %s, %s, now())"
    )
    with connection.cursor() as cursor:
        cursor.execute(insert, [uuid.uuid4(), bytes(32), bytes(16)])  # two completions: fine
        for exact, simhash in ((bytes(16), bytes(16)), (bytes(12), bytes(6))):
            with pytest.raises(IntegrityError), transaction.atomic():
                cursor.execute(insert, [uuid.uuid4(), exact, simhash])
