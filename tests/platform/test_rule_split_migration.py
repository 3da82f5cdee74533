"""Migration moderation 0009: the character-class limits leave the `length` rule for `characters`;
each stored `length` row (the site's and a swarm's) keeps `max_chars` and hands its other
parameters, switch and action to a `characters` row of the same swarm, so the rules in force judge
as before; going back joins them again."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from factories import make_swarm

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("moderation", "0008_rule_per_swarm")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    """Every app's newest migration: going back also unapplied other apps' migrations that depend on the
    one gone back to (such as figures' table names), and the tests after this one need them all."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def _rows() -> dict[tuple[str, int | None], tuple[bool, str, dict]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, swarm_id, enabled, action, params FROM moderation_moderationrule")
        rows = cursor.fetchall()
    # Django's connection reads jsonb as text (its JSONField decodes it)
    return {(key, swarm): (enabled, action, json.loads(params)) for key, swarm, enabled, action, params in rows}


def test_stored_length_rows_keep_their_limits_split_between_length_and_characters():
    from moderation.rules import rules_current, rules_forget, swarm_rules_current

    swarm = make_swarm(slug="long-answers")
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO moderation_moderationrule (key, swarm_id, enabled, action, params, updated_at) VALUES"
                " ('length', NULL, true, 'flag', '{\"max_chars\": 500, \"max_nonprintable_share\": 0.05}', now()),"
                " ('length', %s, true, 'hold', '{\"max_chars\": 9000}', now()),"
                " ('blocklist', NULL, true, 'hold', '{\"patterns\": [\"spam\"]}', now())",
                [swarm.id],
            )
        before = _rows()
        _migrate(_latest())
        assert _rows() == {
            ("length", None): (True, "flag", {"max_chars": 500}),
            ("characters", None): (True, "flag", {"max_nonprintable_share": 0.05}),
            ("length", swarm.id): (True, "hold", {"max_chars": 9000}),
            ("characters", swarm.id): (True, "hold", {}),
            ("blocklist", None): before[("blocklist", None)],
        }
        rules_forget()
        site = rules_current()
        assert (site["length"].action, site["length"]["max_chars"]) == ("flag", 500)
        assert (site["characters"].action, site["characters"]["max_nonprintable_share"]) == ("flag", 0.05)
        assert site["characters"]["max_repeat_share"] == 0.6  # the default it had
        assert set(swarm_rules_current(swarm.id)) == {"length", "characters"}
        _migrate(BEFORE)
        assert _rows() == before
    finally:
        _migrate(_latest())
        rules_forget()
