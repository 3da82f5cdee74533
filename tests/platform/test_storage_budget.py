"""The hourly storage budgets as rollout_share checks them: against the figures the socket's previous
share left (ShareResult.stored) when they are of this hour, against the database otherwise."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from factories import make_node
from support.pool import SAPO, default_swarm, make_group, to_rollout_in

from common.errors import ApplicationError
from pool.budgets import StoredBytes
from pool.ingest import rollout_share
from pool.limits import Limits
from pool.models import NodeStorageHour, Rollout

pytestmark = pytest.mark.django_db


def _share(node, index: int, group: dict | None = None, **kwargs):
    group = group or make_group(index=index)
    return rollout_share(node=node, rollouts=[to_rollout_in(group)], catalogue=SAPO, swarm=default_swarm(), **kwargs)


def _budget_queries(queries) -> int:
    return sum("pool_nodestoragehour" in q["sql"] and q["sql"].lstrip().startswith("SELECT") for q in queries)


def test_a_share_returns_what_its_node_and_contributor_have_stored_this_hour():
    node = make_node()
    sibling = make_node(owner=node.owner, name="sibling")
    make_node(name="stranger")
    first = _share(sibling, 1)
    group = make_group(index=2)
    result = _share(node, 2, group)
    rows = {row.node_id: row.bytes for row in NodeStorageHour.objects.all()}
    assert result.stored.node == rows[node.id] > 0
    assert result.stored.owner == rows[node.id] + rows[sibling.id] == first.stored.owner + rows[node.id]
    assert result.stored.hour == timezone.now().replace(minute=0, second=0, microsecond=0)
    again = _share(node, 2, group, stored=result.stored)  # a resend stores nothing: the figures stay
    assert again.stored == result.stored and again.accepted == result.accepted


def test_the_previous_shares_figures_replace_the_budget_query_within_the_hour():
    node = make_node()
    limits = Limits(max_stored_bytes_per_node_hour=10_000)
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    with CaptureQueriesContext(connection) as queries, pytest.raises(ApplicationError) as refused:
        _share(node, 1, limits=limits, stored=StoredBytes(hour=hour, node=10_000, owner=10_000))
    assert refused.value.code == "over_budget" and _budget_queries(queries) == 0
    assert not Rollout.objects.exists()  # nothing verified or stored
    # Figures of another hour are not this hour's: the database says nothing is stored yet.
    with CaptureQueriesContext(connection) as queries:
        stale = StoredBytes(hour=hour - timedelta(hours=1), node=10_000, owner=10_000)
        assert _share(node, 1, limits=limits, stored=stale).accepted
    assert _budget_queries(queries) == 1
    # Within the hour and under the budget: no query at all.
    with CaptureQueriesContext(connection) as queries:
        assert _share(node, 2, limits=limits, stored=StoredBytes(hour=hour, node=1, owner=1)).accepted
    assert _budget_queries(queries) == 0
