"""Several nodes' shares verified and stored together (pool.ingest.rollout_share_batch): each gets
what it would have got alone, and what is stored and counted is what sharing them one after the
other stores and counts."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from factories import make_node
from support.moderation import group, long_reasoning, share
from support.pool import SAPO, default_swarm, to_rollout_in

from common.errors import ApplicationError
from moderation.models import AuditEntry, ModerationDecision, ModerationFlag, RolloutFingerprint, TrustRecord
from moderation.rules import rules_forget
from nodes.models import Node
from pool.budgets import StoredBytes
from pool.ingest import ShareIn, ShareResult, rollout_share, rollout_share_batch
from pool.models import NodeStorageHour, NodeVerdictCounts, Rollout
from sapo_node.ids import uuid7


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


def _forged(index: int) -> dict:
    g = group(index)
    g["rewards"] = [1.0] * len(g["rewards"])
    return g


def _with_id(g: dict, rollout_id: str) -> dict:
    return {**g, "id": rollout_id}


class _RolledBack(Exception):
    pass


def _answer(result: ShareResult | Exception) -> tuple:
    if isinstance(result, ApplicationError):
        return ("error", result.code)
    stored = result.stored.node if result.stored else None  # None: nothing stored, none given
    return (sorted(result.accepted), sorted((r["id"], r["reason"]) for r in result.rejected), stored)


def _state() -> dict:
    return {
        "rollouts": sorted(
            Rollout.objects.values_list(
                "id", "node_id", "verdict", "reason", "moderation_status", "sampleable", "has_variance"
            )
        ),
        "verdict_counts": sorted(
            NodeVerdictCounts.objects.values_list("node_id", "accepted_groups", "rejected_groups")
        ),
        "storage": sorted(NodeStorageHour.objects.values_list("node_id", "bytes")),
        "trust": sorted(TrustRecord.objects.values_list("node_id", "streak", "accepted", "rejected")),
        "fingerprints": sorted(RolloutFingerprint.objects.values_list("rollout_id", "node_id", "question_hash")),
        "flags": sorted(
            (rid, node, rule, detail, sorted(data.get("sources", [])))
            for rid, node, rule, detail, data in ModerationFlag.objects.values_list(
                "rollout_id", "node_id", "rule", "detail", "data"
            )
        ),
        "audit": sorted(AuditEntry.objects.values_list("rule", "action", "target_id")),
        "decisions": sorted(ModerationDecision.objects.values_list("rollout_id", "status", "rule")),
    }


def _outcome(run) -> tuple[list, list, dict]:
    """Run `run` in a transaction rolled back afterwards: its results, their answers, and what it stored."""
    try:
        with transaction.atomic():
            results = run()
            state = _state()
            raise _RolledBack
    except _RolledBack:
        pass
    return results, [_answer(r) for r in results], state


@pytest.mark.django_db
def test_a_batch_answers_stores_and_counts_what_sharing_one_after_the_other_does():
    a = make_node()
    sibling = make_node(owner=a.owner, name="sibling")
    c = make_node()
    full = make_node()
    earlier = group(7, completions=long_reasoning(group(7)))
    share(a, earlier)  # stored before: a copy of it by another node is caught, by its own node not
    stored_by_other = group(30)
    share(make_node(), stored_by_other)
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    fresh = group(13, completions=long_reasoning(group(13)))  # a's, copied by c in the same batch

    shares = [
        ShareIn(
            a,
            [
                to_rollout_in(g)
                for g in (group(1), group(2), _forged(3), group(7, completions=earlier["completions"]), fresh)
            ],
        ),
        ShareIn(sibling, [to_rollout_in(g) for g in (group(4), _forged(5))]),
        ShareIn(
            c,
            [
                to_rollout_in(g)
                for g in (
                    group(7, completions=earlier["completions"]),
                    group(8),
                    group(13, completions=fresh["completions"]),
                )
            ],
        ),
        ShareIn(full, [to_rollout_in(group(9))], stored=StoredBytes(hour=hour, node=10**12, owner=10**12)),
        # an id another node stored before: a rejection counted for c, nothing stored
        ShareIn(make_node(), [to_rollout_in(_with_id(group(31), stored_by_other["id"])), to_rollout_in(group(32))]),
        # a's second share, and an id a batch-mate sends: both wait for the next batch
        ShareIn(a, [to_rollout_in(group(10))]),
        ShareIn(c, [to_rollout_in(_with_id(group(11), shares_id := str(uuid7())))]),
        ShareIn(sibling, [to_rollout_in(_with_id(group(12), shares_id))]),
    ]

    def one_after_the_other():
        results = []
        for s in shares:
            try:
                results.append(
                    rollout_share(
                        node=s.node, rollouts=s.rollouts, catalogue=SAPO, stored=s.stored, swarm=default_swarm()
                    )
                )
            except ApplicationError as exc:
                results.append(exc)
        return results

    alone, alone_answers, alone_state = _outcome(one_after_the_other)
    batched, batched_answers, batched_state = _outcome(
        lambda: rollout_share_batch(shares=shares, catalogue=SAPO, swarm=default_swarm())
    )

    assert batched_answers == alone_answers
    assert batched_state == alone_state
    # What the scenario is about happened (the comparison alone would pass on a scenario that tests nothing).
    assert alone_answers[3] == ("error", "over_budget")
    assert ("reward_mismatch" in {reason for _, reason in alone_answers[0][1]}) and alone_answers[0][0]
    assert (stored_by_other["id"], "id_conflict") in alone_answers[4][1]
    assert alone_answers[7][1] == [(shares_id, "id_conflict")]
    flagged = {(node, rule) for _, node, rule, _, _ in alone_state["flags"]}
    assert any(node == c.id and rule.startswith("duplicate") for node, rule in flagged)
    assert not any(node == a.id and rule.startswith("duplicate") for node, rule in flagged)
    # c's copy of a group a sent in the same batch is caught, with that group as its source.
    copied = [sources for _, node, rule, _, sources in batched_state["flags"] if node == c.id]
    assert [fresh["id"]] in copied
    # A node's own bytes are exact; its contributor's, when a sibling is in the same batch, are what the
    # batch's snapshot held (the sibling's before it): lower, never higher (the budgets allow one frame).
    for one, other in zip(alone, batched, strict=True):
        if isinstance(one, ShareResult) and one.stored:
            assert other.stored.node == one.stored.node and other.stored.owner <= one.stored.owner


@pytest.mark.django_db(transaction=True)
def test_a_share_that_fails_in_the_database_fails_alone():
    good, other = make_node(), make_node()
    gone = make_node()
    Node.objects.filter(id=gone.id).delete()  # deleted while its socket's share was on its way
    g1, g2, g3 = group(1), group(2), group(3)
    results = rollout_share_batch(
        shares=[
            ShareIn(good, [to_rollout_in(g1)]),
            ShareIn(gone, [to_rollout_in(g2)]),
            ShareIn(other, [to_rollout_in(g3)]),
        ],
        catalogue=SAPO,
        swarm=default_swarm(),
    )
    assert results[0].accepted == [g1["id"]] and results[2].accepted == [g3["id"]]
    assert isinstance(results[1], IntegrityError)
    assert sorted(str(i) for i in Rollout.objects.values_list("id", flat=True)) == sorted([g1["id"], g3["id"]])
    assert sorted(NodeVerdictCounts.objects.values_list("node_id", "accepted_groups")) == sorted(
        [(good.id, 1), (other.id, 1)]
    )
    with pytest.raises(IntegrityError):  # alone, the same failure is the caller's, as before
        rollout_share(node=gone, rollouts=[to_rollout_in(group(4))], catalogue=SAPO, swarm=default_swarm())
