"""Swarms as staff make them (swarms.services): validated and audited changes, versioned catalogues,
one default swarm, and sampling that stays index lookups in one swarm's numbers."""

from __future__ import annotations

import json
import uuid

import pytest
from django.db import IntegrityError, connection, transaction
from factories import make_node, make_swarm, make_user
from psycopg import sql

from common.errors import ApplicationError
from moderation.models import AuditEntry, ModerationRule
from moderation.rules import rules_forget
from pool import sampling
from pool.models import Rollout
from sapo_node.tasks import CATALOGUES
from swarms.catalogue import entries_of_catalogue
from swarms.models import Swarm, SwarmCatalogue
from swarms.services import (
    swarm_catalogue_set,
    swarm_create,
    swarm_default_ensure,
    swarm_make_default,
    swarm_state_set,
    swarm_update,
)

pytestmark = pytest.mark.django_db

EASY = entries_of_catalogue(CATALOGUES["easy"])


@pytest.fixture
def staff():
    return make_user(is_staff=True)


def test_staff_create_a_swarm_with_its_first_catalogue_version_its_sequence_and_an_audit_entry(staff):
    swarm = swarm_create(
        actor=staff,
        slug="easy",
        title="  Easy   tasks ",
        description="For CPUs.\nSmall models welcome.",
        entries=[{**EASY[0], "weight": 3}, *EASY[1:]],
        recommended_models="tiny-mini, tiny",
        default_local=2,
        default_external=6,
        sample_window_seconds="3600",
        reason="a campaign for laptops",
    )
    assert (swarm.title, swarm.state, swarm.catalogue_version) == ("Easy tasks", "open", 1)
    assert swarm.recommended_models == ["tiny-mini", "tiny"] and swarm.sample_window_seconds == 3600
    row = SwarmCatalogue.objects.get(swarm=swarm, version=1)
    assert [e["weight"] for e in row.entries] == [3.0, 1.0, 1.0, 1.0] and row.created_by == staff
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(%s::regclass)", [swarm.sample_sequence])
        assert cursor.fetchone() == (1,)
    entry = AuditEntry.objects.get(action="swarm_create")
    assert (entry.actor, entry.target_type, entry.target_id, entry.reason) == (
        staff,
        "swarm",
        str(swarm.id),
        "a campaign for laptops",
    )


@pytest.mark.parametrize(
    ("entries", "field"),
    [
        ([], "entries"),
        ([{"dataset": "no_such_dataset"}], "entries[0].dataset"),
        ([EASY[0], {"dataset": "basic_arithmetic", "config": {"min_terms": "two"}}], "entries[1].config"),
        ([{"dataset": "basic_arithmetic", "config": {"no_such_option": 1}}], "entries[0].config"),
        ([{"dataset": "basic_arithmetic", "config": [1, 2]}], "entries[0].config"),
        ([{"dataset": "basic_arithmetic", "weight": 0}], "entries[0].weight"),
        ([{"dataset": "basic_arithmetic"}, {"dataset": "basic_arithmetic"}], "entries[1].dataset"),
        ([{"dataset": "basic_arithmetic", "extra": 1}], "entries[0]"),
    ],
)
def test_a_bad_catalogue_is_refused_with_the_field_named_and_nothing_stored(staff, entries, field):
    before = Swarm.objects.count()
    with pytest.raises(ApplicationError) as refused:
        swarm_create(actor=staff, slug="bad", title="Bad", entries=entries)
    assert refused.value.code == "invalid_catalogue" and refused.value.extra["field"] == field
    assert Swarm.objects.count() == before and not AuditEntry.objects.filter(action="swarm_create").exists()


def test_a_configuration_that_builds_for_ever_is_refused_in_time_with_the_field_named(staff, monkeypatch):
    """reasoning-gym took 9.5 s to build a chain_sum of a million terms on a loaded 2-core machine; one
    of five million, far past the limit, is stopped when its CPU time is up (in a worker process the
    check kills) and the entry's config is refused, nothing stored."""
    import time

    from swarms import catalogue

    monkeypatch.setattr(catalogue, "BUILD_CPU_SECONDS", 1.0)
    endless = {"dataset": "chain_sum", "config": {"min_terms": 5_000_000, "max_terms": 5_000_000}}
    before = Swarm.objects.count()
    started = time.monotonic()
    with pytest.raises(ApplicationError) as refused:
        swarm_create(actor=staff, slug="endless", title="Endless", entries=[EASY[0], endless])
    assert time.monotonic() - started < 20
    assert refused.value.code == "invalid_catalogue" and refused.value.extra["field"] == "entries[1].config"
    assert "took more than 1 CPU-s to build an entry of chain_sum" in refused.value.message
    assert Swarm.objects.count() == before


def test_the_catalogue_check_as_a_whole_is_bounded_too(staff, monkeypatch):
    from swarms import catalogue

    monkeypatch.setattr(catalogue, "CHECK_SECONDS", 0.0)
    with pytest.raises(ApplicationError) as refused:
        swarm_create(actor=staff, slug="slow", title="Slow", entries=EASY)
    assert refused.value.extra["field"] == "entries[0].config" and "took more than 0 s in all" in refused.value.message


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"slug": "Not A Slug"}, "slug"),
        ({"slug": "any"}, "slug"),
        ({"slug": "-x"}, "slug"),
        ({"title": ""}, "title"),
        ({"title": "x" * 81}, "title"),
        ({"title": "hidden\u202etext"}, "title"),
        ({"description": "y" * 1001}, "description"),
        ({"default_local": 999}, "default_local"),
        ({"sample_window_seconds": 5}, "sample_window_seconds"),
        ({"recommended_models": ["m"] * 17}, "recommended_models"),
    ],
)
def test_untrusted_text_and_numbers_are_bounded_and_refused_with_the_field_named(staff, fields, field):
    args = {"slug": "ok", "title": "Fine", "entries": EASY, **fields}
    with pytest.raises(ApplicationError) as refused:
        swarm_create(actor=staff, **args)
    assert refused.value.code == "invalid_swarm" and refused.value.extra["field"] == field
    assert not Swarm.objects.filter(slug=args["slug"]).exists()


def test_the_sites_text_rules_apply_to_a_swarms_text(staff):
    ModerationRule.objects.create(key="blocklist", enabled=True, action="hold", params={"patterns": [r"\bspam+\b"]})
    rules_forget()
    try:
        for fields in ({"description": "we SPAMM the pool"}, {"title": "Spam swarm"}, {"recommended_models": ["spam"]}):
            with pytest.raises(ApplicationError) as refused:
                swarm_create(actor=staff, slug="ok", **{"title": "Fine", **fields}, entries=EASY)
            assert refused.value.code == "text_blocked"
        assert not Swarm.objects.filter(slug="ok").exists()
    finally:
        ModerationRule.objects.filter(key="blocklist").delete()
        rules_forget()


def test_only_staff_change_swarms(staff):
    swarm = make_swarm(actor=staff)
    contributor = make_user()
    with pytest.raises(ApplicationError) as refused:
        swarm_state_set(actor=contributor, swarm=swarm, state="paused", reason="mine now")
    assert refused.value.status == 403
    with pytest.raises(ApplicationError):
        swarm_create(actor=contributor, slug="mine", title="Mine", entries=EASY)


def test_a_catalogue_edit_writes_the_next_version_and_keeps_the_old_one_unchanged(staff):
    swarm = make_swarm(actor=staff, catalogue="easy")
    v2 = swarm_catalogue_set(
        actor=staff, swarm=swarm, entries=entries_of_catalogue(CATALOGUES["sapo"]), reason="harder"
    )
    swarm.refresh_from_db()
    assert (v2.version, swarm.catalogue_version) == (2, 2)
    v1 = SwarmCatalogue.objects.get(swarm=swarm, version=1)
    assert [e["dataset"] for e in v1.entries] == CATALOGUES["easy"].datasets
    with pytest.raises(PermissionError):
        v1.save()
    with pytest.raises(PermissionError):
        SwarmCatalogue.objects.filter(swarm=swarm).update(entries=[])
    assert AuditEntry.objects.get(action="swarm_catalogue").details["version"] == 2


def test_edits_and_states_are_audited_and_a_retired_swarm_is_read_only(staff):
    swarm = make_swarm(actor=staff)
    swarm_update(actor=staff, swarm=swarm, title="New title", reason="clearer")
    swarm_update(actor=staff, swarm=swarm, title="New title")  # no change: nothing recorded
    swarm_state_set(actor=staff, swarm=swarm, state="paused", reason="maintenance")
    swarm_state_set(actor=staff, swarm=swarm, state="open", reason="done")
    with pytest.raises(ApplicationError) as no_reason:
        swarm_state_set(actor=staff, swarm=swarm, state="retired", reason=" ")
    assert no_reason.value.code == "reason_required"
    swarm_state_set(actor=staff, swarm=swarm, state="retired", reason="campaign over")
    actions = list(
        AuditEntry.objects.filter(target_type="swarm", target_id=str(swarm.id)).values_list("action", flat=True)
    )
    assert sorted(actions) == sorted(["swarm_create", "swarm_edit", "swarm_pause", "swarm_open", "swarm_retire"])
    for change in (
        lambda: swarm_update(actor=staff, swarm=swarm, title="Again"),
        lambda: swarm_state_set(actor=staff, swarm=swarm, state="open", reason="undo"),
        lambda: swarm_catalogue_set(actor=staff, swarm=swarm, entries=EASY),
    ):
        with pytest.raises(ApplicationError) as refused:
            change()
        assert refused.value.code == "swarm_retired"


def test_there_is_one_default_swarm_and_it_cannot_be_retired(staff):
    default = swarm_default_ensure()
    other = make_swarm(actor=staff)
    with pytest.raises(ApplicationError) as refused:
        swarm_state_set(actor=staff, swarm=default, state="retired", reason="x")
    assert refused.value.code == "default_swarm"
    with pytest.raises(IntegrityError), transaction.atomic():
        Swarm.objects.filter(id=other.id).update(is_default=True)
    swarm_make_default(actor=staff, swarm=other, reason="the new main campaign")
    assert list(Swarm.objects.filter(is_default=True)) == [Swarm.objects.get(id=other.id)]
    swarm_state_set(actor=staff, swarm=default, state="retired", reason="moved on")


# Sampling, per swarm ------------------------------------------------------------------------

_FILL = """
WITH r AS (
INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
    has_variance, sampleable, sample_seq, created_at)
SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid,
       %(node)s, %(swarm)s, 1, 1, 'basic_arithmetic', 1, g, 2,
       '[1, 0]', '[1, 0]', 'accepted', '', 'ok', true, true, nextval(%(sequence)s::regclass), at
FROM generate_series(1, %(n)s) AS g, LATERAL (SELECT now() - make_interval(secs => %(n)s - g) AS at) AS t
RETURNING id, swarm_id, created_at
)
INSERT INTO pool_rollouttext (rollout_id, swarm_id, created_at, question, answer, completions)
SELECT id, swarm_id, created_at, 'q', 'a', '["x", "y"]' FROM r
"""


def _plan(statement: str, params: dict) -> str:
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("EXPLAIN {}").format(sql.SQL(statement)), params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_sampling_with_two_swarms_is_index_lookups_in_the_askers_swarm(staff):
    first, second = make_swarm(actor=staff), make_swarm(actor=staff)
    author, asker = make_node(), make_node()
    with connection.cursor() as cursor:
        for swarm, n in ((first, 20_000), (second, 20_000)):
            cursor.execute(_FILL, {"node": author.id, "swarm": swarm.id, "sequence": swarm.sample_sequence, "n": n})
        cursor.execute("ANALYZE pool_rollout")
        cursor.execute("ANALYZE pool_rollouttext")
    # Each swarm numbers its groups densely from 1.
    with connection.cursor() as cursor:
        cursor.execute("SELECT swarm_id, min(sample_seq), max(sample_seq) FROM pool_rollout GROUP BY 1 ORDER BY 1")
        assert cursor.fetchall() == [(first.id, 1, 20_000), (second.id, 1, 20_000)]
    params = {"cutoff": "-infinity", "node": asker.id, "swarm": first.id, "k": 12, "id_floor": uuid.UUID(int=0)}
    plan = _plan(sampling._DRAW_TEXT, params)  # the statement a `sample` runs
    # The groups' texts are in one partition (today's, or DEFAULT when the test database was migrated
    # after the groups' day began), their ledger rows in this month's (or DEFAULT, the same way); the
    # empty ones (days and months made ahead, or DEFAULT) cost nothing to scan.
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM pool_rollout")
        holding = [row[0] for row in cursor.fetchall()]
    for partition in holding:
        assert f"Seq Scan on {partition} " not in plan and f"Bitmap Heap Scan on {partition} " not in plan, plan
        assert f"{partition}_swarm_id_sample_seq_idx" in plan and f"{partition}_swarm_id_created_at_idx" in plan, plan
    drawn = sampling.rollout_sample(node=asker, n=8, window_seconds=10**6, swarm_id=second.id)
    ids = [json.loads(text)["id"] for text in drawn.texts]
    assert len(ids) == 8 and set(Rollout.objects.filter(id__in=ids).values_list("swarm_id", flat=True)) == {second.id}
