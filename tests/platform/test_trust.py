"""Node trust: the formula, what raises and resets it, and what it changes (quota, holds)."""

from __future__ import annotations

import pytest
from factories import make_node
from support.moderation import group, set_rule, share, staff
from support.pool import sampled

from moderation.models import TrustRecord
from moderation.rules import rules_forget
from moderation.services import rollout_moderate
from moderation.trust import (
    VerdictCounts,
    node_message_quotas,
    sample_acceptance,
    trust_for_nodes,
    trust_value,
    verdict_counts,
)
from pool.models import ModerationStatus

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


def forged(index: int) -> dict:
    g = group(index)
    g["rewards"] = [1.0] * len(g["rewards"])
    return g


def test_the_formula():
    assert trust_value(0, 9) == pytest.approx(0.1)
    assert trust_value(8, 9) == pytest.approx(0.5)
    assert trust_value(90, 9) == pytest.approx(91 / 100)


def test_a_batch_of_verdicts_counts_and_restarts_the_streak_after_its_last_rejection():
    assert verdict_counts([True, False, True, True]) == VerdictCounts(accepted=3, rejected=1, streak=2)
    assert verdict_counts([True, True, False]) == VerdictCounts(accepted=2, rejected=1, streak=0)
    assert verdict_counts([True, True]) == VerdictCounts(accepted=2, rejected=0, streak=2)


@pytest.mark.parametrize("seed", range(6))
def test_the_statements_trust_counts_are_verdict_counts_of_the_groups_it_inserted(seed):
    # The pool's INSERT statement counts verdicts into trust in SQL (moderation.trust.TRUST_VERDICTS_CTES)
    # for the groups it really inserts: a resent group is neither counted again nor does its verdict
    # move the streak. Random batches of accepted and forged groups in random order, some resent.
    import random

    from moderation.models import AuditEntry, RolloutFingerprint

    rng = random.Random(seed)
    node = make_node()
    stored: list[dict] = []
    bad: set[str] = set()  # the forged groups' ids (rejected: reward_mismatch)
    expected = VerdictCounts(0, 0, 0)
    for batch in range(4):
        fresh = []
        for i in range(rng.randint(1, 6)):
            index = 1000 + 100 * seed + 10 * batch + i
            fresh.append(forged(index) if rng.random() < 0.35 else group(index))
            if fresh[-1]["rewards"] != group(index)["rewards"]:
                bad.add(fresh[-1]["id"])
        resent = rng.sample(stored, k=min(len(stored), rng.randint(0, 3)))
        groups = fresh + resent
        rng.shuffle(groups)
        share(node, *groups)
        new = {g["id"] for g in fresh}
        counts = verdict_counts([g["id"] not in bad for g in groups if g["id"] in new])  # in the order shared
        streak = counts.streak if counts.rejected else expected.streak + counts.accepted
        expected = VerdictCounts(expected.accepted + counts.accepted, expected.rejected + counts.rejected, streak)
        record = TrustRecord.objects.get(node=node)
        assert VerdictCounts(record.accepted, record.rejected, record.streak) == expected
        stored += fresh
    assert 0 < len(bad) < len(stored)
    # What the statement wrote about each group, once, however often it was sent: a fingerprint per
    # accepted group, an automatic verdict in the audit per rejected one.
    assert RolloutFingerprint.objects.filter(node=node).count() == len(stored) - len(bad)
    verdicts = AuditEntry.objects.filter(action="auto_verdict", target_id__in=[g["id"] for g in stored])
    assert sorted(verdicts.values_list("target_id", flat=True)) == sorted(bad)


def test_a_run_of_accepted_groups_raises_trust_and_a_rejection_resets_it():
    node = make_node()
    assert trust_for_nodes([node.id]) == pytest.approx({node.id: 0.1})  # a new node
    share(node, *[group(i) for i in range(1, 9)])
    assert TrustRecord.objects.get(node=node).streak == 8
    assert trust_for_nodes([node.id]) == pytest.approx({node.id: 0.5})

    share(node, group(20), forged(21), group(22))  # the streak restarts after the rejection
    record = TrustRecord.objects.get(node=node)
    assert (record.streak, record.accepted, record.rejected) == (1, 10, 1)
    assert trust_for_nodes([node.id]) == pytest.approx({node.id: 2 / 11})


def test_a_moderator_rejection_resets_the_streak():
    node = make_node()
    rows = share(node, *[group(i) for i in range(30, 35)])
    assert TrustRecord.objects.get(node=node).streak == 5
    rollout_moderate(actor=staff(), rollout_id=rows[0].id, action="reject", reason="nonsense reasoning")
    assert TrustRecord.objects.get(node=node).streak == 0


def test_low_trust_lowers_the_message_quota():
    fresh, steady = make_node(), make_node()
    share(steady, *[group(i) for i in range(40, 48)])  # trust 0.5
    assert node_message_quotas(node_ids=[fresh.id, steady.id], base=600) == {
        fresh.id: int(600 * (0.25 + 0.75 * 0.1)),
        steady.id: int(600 * (0.25 + 0.75 * 0.5)),
    }
    set_rule("trust", enabled=False)
    assert node_message_quotas(node_ids=[fresh.id, steady.id], base=600) == {fresh.id: 600, steady.id: 600}


@pytest.mark.parametrize("duplicate_rules", [True, False])  # trust is read with the candidates, or alone
def test_low_trust_can_hold_a_nodes_groups_for_review(duplicate_rules):
    set_rule("low_trust", threshold=0.3)
    if not duplicate_rules:
        set_rule("duplicate_exact", enabled=False)
        set_rule("duplicate_near", enabled=False)
    node = make_node()
    (first,) = share(node, group(50))
    first.refresh_from_db()
    assert first.moderation_status == ModerationStatus.HELD and not first.sampleable
    share(node, *[group(i) for i in range(51, 60)])  # streak 10 -> trust 0.55
    (later,) = share(node, group(60))
    later.refresh_from_db()
    assert later.moderation_status == ModerationStatus.OK and later.sampleable


def test_sample_acceptance_is_linear_between_the_floor_and_one():
    assert sample_acceptance(0.0, floor=0.1) == pytest.approx(0.1)
    assert sample_acceptance(1.0, floor=0.1) == pytest.approx(1.0)


@pytest.mark.parametrize("enumerate_below", [512, 0], ids=["enumerated", "probed"])
def test_trust_weighted_sampling_prefers_trusted_authors(monkeypatch, enumerate_below):
    import random

    import pool.sampling

    monkeypatch.setattr(pool.sampling, "ENUMERATE_BELOW", enumerate_below)
    trusted, fresh, asker = make_node(), make_node(), make_node()
    share(trusted, *[group(i) for i in range(100, 110)])
    share(fresh, *[group(i) for i in range(200, 210)])
    TrustRecord.objects.filter(node=trusted).update(streak=10_000)  # trust ~1.0
    TrustRecord.objects.filter(node=fresh).update(streak=0)  # trust 0.1, as after a rejection
    rng = random.Random(7)

    def trusted_share(draws: int = 200) -> float:
        authors = [sampled(asker, 1, rng=rng)[0]["node"] for _ in range(draws)]
        return authors.count(trusted.name) / draws

    assert 0.35 < trusted_share() < 0.65  # weighting off: uniform
    set_rule("trust", sample_weighting=True, sample_floor=0.01)
    # Acceptance 1.0 vs 0.01 + 0.99 * 0.1 = 0.109: the trusted node's share is 1 / 1.109 = 0.90.
    assert trusted_share() > 0.8
    # Asking for more groups than the trusted node has still fills up from the others.
    assert len(sampled(asker, 15, rng=rng)) == 15
