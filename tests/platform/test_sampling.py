"""Uniform sampling from the pool (pool.sampling.rollout_sample) and what is never sampled."""

from __future__ import annotations

import random
import re
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from factories import make_node
from support.pool import EASY, default_swarm, make_group, sampled, to_rollout_in

from common.compact_json import dumps_object
from pool import sampling
from pool.ingest import rollout_share
from pool.models import Rollout, RolloutText, ServedGroup
from pool.services import rollout_set_moderation
from sapo_node import protocol

pytestmark = pytest.mark.django_db
DAY = 86_400


def share(node, *groups):
    return rollout_share(node=node, rollouts=[to_rollout_in(g) for g in groups], catalogue=EASY, swarm=default_swarm())


def easy_group(index: int, **kwargs):
    return make_group("basic_arithmetic", seed=5, index=index, catalogue=EASY, **kwargs)


def sampled_ids(node, n=50, **kwargs) -> set[str]:
    return {g["id"] for g in sampled(node, n, window_seconds=DAY, **kwargs)}


@pytest.fixture(params=["enumerate", "probe"])
def path(request, monkeypatch):
    """Run each test through both draws: listing a small window, and probing random numbers."""
    if request.param == "probe":
        monkeypatch.setattr(sampling, "ENUMERATE_BELOW", 0)
    return request.param


def test_only_other_nodes_fresh_verified_varied_unmoderated_groups_are_sampled(path):
    asker, author = make_node(name="asker"), make_node(name="author")
    good = [easy_group(i) for i in range(5)]
    own = easy_group(10)
    forged = easy_group(11)
    forged["rewards"] = [1.0] * len(forged["rewards"])
    all_right, all_wrong = easy_group(12, right=3, wrong=0), easy_group(13, right=0, wrong=3)
    stale, quarantined, held = easy_group(14), easy_group(15), easy_group(16)
    share(asker, own)
    share(author, *good, forged, all_right, all_wrong, stale, quarantined, held)
    two_days_earlier = Rollout.objects.get(id=stale["id"]).created_at - timedelta(days=2)
    Rollout.objects.filter(id=stale["id"]).update(created_at=two_days_earlier)
    RolloutText.objects.filter(rollout_id=stale["id"]).update(created_at=two_days_earlier)
    rollout_set_moderation(rollouts=[quarantined["id"]], status="quarantined")
    rollout_set_moderation(rollouts=[held["id"]], status="held")
    expected = {g["id"] for g in good}
    for _ in range(5):
        assert sampled_ids(asker) == expected
    # The author sees only the asker's group.
    assert sampled_ids(author) == {own["id"]}


def test_sample_returns_n_distinct_groups_and_fewer_when_fewer_exist(path):
    asker, author = make_node(), make_node()
    share(author, *[easy_group(i) for i in range(30)])
    draw = sampled(asker, 10, window_seconds=DAY)
    assert len(draw) == 10 == len({g["id"] for g in draw})
    assert all(g["node"] == author.name for g in draw)
    assert len(sampled(asker, 64, window_seconds=DAY)) == 30
    assert sampled(author, 5, window_seconds=DAY) == []


def test_an_empty_pool_samples_nothing():
    assert sampled(make_node(), 4, window_seconds=DAY) == []


def test_moderation_back_to_ok_makes_a_group_sampleable_again(path):
    asker, author = make_node(), make_node()
    group = easy_group(1)
    share(author, group)
    rollout_set_moderation(rollouts=[group["id"]], status="rejected")
    assert sampled_ids(asker) == set()
    rollout_set_moderation(rollouts=Rollout.objects.filter(node=author), status="ok")
    assert sampled_ids(asker) == {group["id"]}


def test_a_held_group_first_released_gets_a_sample_number():
    asker, author = make_node(), make_node()
    group = easy_group(1)
    share(author, group)
    Rollout.objects.filter(id=group["id"]).update(sampleable=False, sample_seq=None, moderation_status="held")
    rollout_set_moderation(rollouts=[group["id"]], status="ok")
    row = Rollout.objects.get(id=group["id"])
    assert row.sampleable and row.sample_seq is not None
    assert sampled_ids(asker) == {group["id"]}


def test_draws_are_uniform_despite_holes_in_the_numbering(monkeypatch):
    """Chi-square check: with half the numbers unusable (own groups, moderated), every eligible
    group is drawn equally often."""
    monkeypatch.setattr(sampling, "ENUMERATE_BELOW", 0)
    asker, author = make_node(), make_node()
    groups = [easy_group(i) for i in range(40)]
    share(author, *groups[:20])
    share(asker, *[easy_group(100 + i) for i in range(10)])  # the asker's own: holes
    share(author, *groups[20:])
    rollout_set_moderation(rollouts=[g["id"] for g in groups[30:]], status="quarantined")  # more holes
    eligible = [g["id"] for g in groups[:30]]
    rng = random.Random(7)
    counts: Counter[str] = Counter()
    draws = 400
    for _ in range(draws):
        counts.update(g["id"] for g in sampled(asker, 3, window_seconds=DAY, rng=rng))
    assert set(counts) == set(eligible)
    expected = draws * 3 / len(eligible)
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in eligible)
    assert chi2 < 58.3  # the 0.999 quantile of chi-square with 29 degrees of freedom


def test_a_whole_share_stays_in_the_window_when_its_rows_move(path):
    """One share's groups have one created_at; the window starts at the smallest of their numbers,
    whichever of them the index returns first (here the restored ones have moved behind the last)."""
    asker, author = make_node(name="asker"), make_node(name="author")
    groups = [easy_group(i) for i in range(6)]
    share(author, *groups)
    moved = [g["id"] for g in groups[:-1]]
    rollout_set_moderation(rollouts=moved, status="quarantined")
    rollout_set_moderation(rollouts=moved, status="ok")
    for _ in range(5):
        assert sampled_ids(asker) == {g["id"] for g in groups}


def _has_lz4() -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'")
        return bool(cursor.fetchone()[0])


def test_completions_are_compressed_with_lz4_where_the_server_has_it_and_read_back_as_sent():
    """pglz costs the pool's INSERT a large part of its database CPU compressing a group's completions;
    migration pool 0005 makes it lz4 (docs/benchmarks.md, "How ingest is made fast"), and a server
    built without lz4 keeps pglz."""
    from django.db import connection
    from support.moderation import group, share

    g = group(31)
    words = " ".join(f"step {i} carries the digit and checks the partial sum again" for i in range(8))
    completions = [f"{words} ({k}) <answer>{g['answer'] if k % 2 else 'no'}</answer>" for k in range(8)]
    (row,) = share(make_node(), group(31, completions=completions))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_compression(completions) FROM pool_rollouttext WHERE rollout_id = %s", [row.id]
        )
        assert cursor.fetchone()[0] == ("lz4" if _has_lz4() else "pglz")
    assert Rollout.objects.with_texts().get(id=row.id).completions == completions


def test_the_socket_s_json_is_the_protocol_object_of_each_group_drawn(path) -> None:
    """rollout_sample (the node socket's `samples`) writes each group's JSON by hand
    (pool.payloads.sampled_group_json): the same object as the stored group's fields encoded by json,
    texts with quotes, backslashes, line breaks and non-ASCII characters included, through both draws."""
    import json

    def protocol_object(r: Rollout) -> dict:  # docs/protocol.md, "samples"
        return {
            "id": str(r.id),
            "round": r.round,
            "task": {"dataset": r.dataset, "seed": r.seed, "index": r.index},
            "question": r.question,
            "answer": r.answer,
            "completions": r.completions,
            "rewards": r.verified_rewards,
            "proof": r.proof,
            "node": r.node.name,
        }

    author, asker = make_node(), make_node()
    odd = ['He said "no"\\n', "tab\there\nand a line", "accent é, emoji 🙂 \u2028"]
    groups = [easy_group(i) for i in range(12)]
    for group in groups[::2]:  # two wrong completions (reward 0) with texts JSON must escape
        group["completions"][2:] = odd[:2] if group is groups[0] else odd[1:]
    share(author, *groups)
    drawn = sampling.rollout_sample(
        node=asker, n=8, window_seconds=DAY, swarm_id=default_swarm().swarm_id, rng=random.Random(3)
    )
    reply = json.loads(dumps_object({"type": protocol.SAMPLES, "rollouts": drawn}))  # as the socket sends it
    assert [json.loads(text) for text in drawn.texts] == reply["rollouts"] and len(reply["rollouts"]) == 8
    ids = [uuid.UUID(group["id"]) for group in reply["rollouts"]]
    stored = {r.id: r for r in Rollout.objects.select_related("node").with_texts().filter(id__in=ids)}
    for rollout_id, group in zip(ids, reply["rollouts"], strict=True):
        assert group == json.loads(json.dumps(protocol_object(stored[rollout_id])))
    # The groups sent are the node's to report as used (and only those).
    assert set(ServedGroup.objects.filter(node=asker).values_list("rollout_id", flat=True)) == set(ids)


def test_sampling_reads_the_ledger_s_recent_months_only():
    """The draw's id floor (the window's start less the ids' greatest age) lets the planner leave out
    the ledger's older month partitions; the DEFAULT one (ids of no made month) is read."""
    from datetime import UTC, date

    from django.db import connection
    from django.utils import timezone
    from psycopg import sql

    from pool import retention
    from pool.selectors import window_id_floor
    from swarms.services import swarm_default_ensure

    now = timezone.now()
    old = date(2025, 3, 1)
    retention.ledger_partitions_ensure(since=old)
    cutoff = now - timedelta(seconds=DAY)
    params = {"cutoff": cutoff, "node": 0, "swarm": swarm_default_ensure().id, "k": 12}
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL("EXPLAIN {}").format(sql.SQL(sampling._DRAW_TEXT)),
            {**params, "id_floor": window_id_floor(cutoff)},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    this_month = now.astimezone(UTC).date().replace(day=1)
    assert retention.ledger_partition_name(this_month) in plan and "pool_rollout_default" in plan
    assert retention.ledger_partition_name(old) not in plan
    read = {name for name in retention.ledger_partitions().values() if name in plan}
    assert len(read) <= 2 + retention.AHEAD_MONTHS  # the floor's month, this one, the ones made ahead
    # The socket's draw is prepared with a generic plan (common.db.prepare_hot): it leaves the old month
    # out when it starts.
    names: list[str] = []

    def numbered(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    statement = re.sub(r"%\((\w+)\)s", numbered, sampling._DRAW_TEXT).replace("%%", "%")
    types = {"k": "int", "swarm": "bigint", "node": "bigint", "cutoff": "timestamptz", "id_floor": "uuid"}
    values = {**params, "id_floor": window_id_floor(cutoff)}
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(
            sql.SQL("PREPARE draw_plan_test ({}) AS {}").format(
                sql.SQL(", ").join(sql.SQL(types[name]) for name in names), sql.SQL(statement)
            )
        )
        cursor.execute(
            sql.SQL("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE draw_plan_test ({})").format(
                sql.SQL(", ").join(sql.Literal(values[name]) for name in names)
            )
        )
        generic = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE draw_plan_test")
    assert "Subplans Removed" in generic and retention.ledger_partition_name(old) not in generic
    assert retention.ledger_partition_name(this_month) in generic
