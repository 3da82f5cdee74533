"""The pool's table as migrated: what every stored group costs in index entries."""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def test_one_index_leads_with_the_node_of_a_group():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pool_rollout'")
        indexes = dict(cursor.fetchall())
    led_by_node = sorted(name for name, definition in indexes.items() if "(node_id" in definition)
    assert led_by_node == ["pool_rollout_node_idx"], indexes  # (node_id, created_at DESC) serves lookups by node
