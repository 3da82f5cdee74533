"""Group ids (docs/protocol.md, "share"): the pool takes a UUIDv7 of at most ID_MAX_AGE_SECONDS ago and
ID_MAX_AHEAD_SECONDS ahead; any other id it does not hold gets `bad_id` and nothing is stored or
counted, while an id it holds, whatever its form, gets its stored verdict (a resend from a spool of an
older client). Stored groups land in the ledger's month partition of their id."""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.utils import timezone
from factories import make_node
from support.pool import EASY, default_swarm, make_group, to_rollout_in, uuid7_time
from test_web_data import make_group as stored_group

from pool import retention
from pool.ingest import id_fits, rollout_share
from pool.models import NodeVerdictCounts, Rollout, RolloutText
from sapo_node import protocol
from sapo_node.ids import is_uuid7, uuid7, uuid7_floor

pytestmark = pytest.mark.django_db


def share(node, *groups):
    return rollout_share(node=node, rollouts=[to_rollout_in(g) for g in groups], catalogue=EASY, swarm=default_swarm())


def group(index: int, rollout_id: uuid.UUID | str | None = None):
    return make_group("basic_arithmetic", seed=5, index=index, catalogue=EASY, rollout_id=str(rollout_id or uuid7()))


def test_uuid7_carries_its_time_version_and_variant_and_sorts_by_time():
    now = timezone.now()
    ids = [uuid7(now + timedelta(milliseconds=k)) for k in range(50)]
    assert all(is_uuid7(i) and i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids) and abs(uuid7_time(ids[0]) - now) < timedelta(milliseconds=1)
    assert uuid7_floor(now) <= ids[0] < uuid7_floor(now + timedelta(milliseconds=1))
    assert not is_uuid7(uuid.uuid4())


def test_the_id_rule_bounds_the_time_around_the_server_s_clock():
    now = timezone.now()
    age, ahead = timedelta(seconds=protocol.ID_MAX_AGE_SECONDS), timedelta(seconds=protocol.ID_MAX_AHEAD_SECONDS)
    assert id_fits(uuid7(now), now) and id_fits(uuid7(now - age + timedelta(seconds=1)), now)
    assert id_fits(uuid7(now + ahead - timedelta(seconds=1)), now)
    assert not id_fits(uuid7(now - age - timedelta(seconds=1)), now)
    assert not id_fits(uuid7(now + ahead + timedelta(seconds=1)), now)
    assert not id_fits(uuid.uuid4(), now)


def test_refused_ids_get_bad_id_in_place_and_nothing_of_them_is_stored_or_counted():
    node = make_node()
    now = timezone.now()
    refused = [
        group(1, uuid.uuid4()),
        group(2, uuid7(now - timedelta(seconds=protocol.ID_MAX_AGE_SECONDS + 60))),
        group(3, uuid7(now + timedelta(seconds=protocol.ID_MAX_AHEAD_SECONDS + 60))),
    ]
    good = [group(4), group(5)]
    result = share(node, good[0], *refused, good[1])
    assert result.accepted == [good[0]["id"], good[1]["id"]]
    assert result.rejected == [{"id": g["id"], "reason": protocol.BAD_ID} for g in refused]
    assert set(map(str, Rollout.objects.values_list("id", flat=True))) == {g["id"] for g in good}
    assert RolloutText.objects.count() == 2
    counts = NodeVerdictCounts.objects.get(node=node)
    assert (counts.accepted_groups, counts.rejected_groups) == (2, 0)
    only_refused = share(node, refused[0])
    assert only_refused.accepted == [] and only_refused.rejected == [{"id": refused[0]["id"], "reason": "bad_id"}]


def test_an_id_the_pool_holds_gets_its_stored_verdict_whatever_its_form():
    """A UUIDv4 group stored before the pool took UUIDv7 only, sent again from a node's spool (its ack
    was lost): answered as stored, not stored again; another node's: id_conflict."""
    author, other = make_node(), make_node()
    old = stored_group(author, created_at=timezone.now() - timedelta(days=30))
    Rollout.objects.filter(id=old.id).update(id=(legacy := uuid.uuid4()))
    RolloutText.objects.filter(rollout_id=old.id).update(rollout_id=legacy)
    again = group(7, legacy)
    assert share(author, again).accepted == [str(legacy)]
    assert share(other, again).rejected == [{"id": str(legacy), "reason": "id_conflict"}]
    assert Rollout.objects.filter(id=legacy).count() == 1 and Rollout.objects.count() == 1


def test_a_group_lands_in_its_id_s_month_and_an_old_pool_s_ids_in_the_default_partition():
    node = make_node()
    retention.ledger_partitions_ensure()
    (row,) = [share(node, g) for g in [group(9)]]
    legacy = stored_group(node)
    Rollout.objects.filter(id=legacy.id).update(id=(v4 := uuid.UUID("00000000-0000-4000-8000-000000000001")))
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, tableoid::regclass::text FROM pool_rollout")
        where = dict(cursor.fetchall())
    month = timezone.now().astimezone(UTC).date().replace(day=1)
    assert where[uuid.UUID(row.accepted[0])] == retention.ledger_partition_name(month)
    assert where[v4] == retention.LEDGER_DEFAULT
