"""Verification of shared groups (pure: no database)."""

from __future__ import annotations

import pytest
from support.pool import EASY, SAPO, make_group, to_rollout_in

from pool.verification import ACCEPTED, REJECTED, has_variance, verify_rollout


@pytest.mark.parametrize("dataset", [spec.dataset for spec in SAPO.tasks])
def test_an_honest_group_of_every_sapo_dataset_is_accepted(dataset):
    group = make_group(dataset, seed=1000 + len(dataset), index=3)
    check = verify_rollout(to_rollout_in(group), SAPO)
    assert (check.verdict, check.reason) == (ACCEPTED, "")
    assert list(check.verified_rewards) == group["rewards"]


def test_propositional_logic_has_a_null_answer_and_is_accepted():
    group = make_group("propositional_logic")
    assert group["answer"] is None
    assert verify_rollout(to_rollout_in(group), SAPO).verdict == ACCEPTED


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (lambda g: g.update(rewards=[1.0] * len(g["rewards"])), "reward_mismatch"),
        (lambda g: g.update(answer="12345678"), "answer_mismatch"),
        (lambda g: g.update(question="What is 2 + 2?"), "question_mismatch"),
        (lambda g: g["task"].update(index=g["task"]["index"] + 1), "question_mismatch"),
        (lambda g: g["task"].update(dataset="chess_puzzles"), "unknown_task"),
        (lambda g: g["task"].update(index=-1), "bad_index"),
        (lambda g: g["task"].update(seed=2**40), "bad_index"),
    ],
)
def test_a_forged_group_is_rejected_with_its_reason(forge, reason):
    group = make_group(right=1, wrong=1)
    forge(group)
    check = verify_rollout(to_rollout_in(group), SAPO)
    assert (check.verdict, check.reason) == (REJECTED, reason)


def test_verified_rewards_are_kept_for_a_forged_reward():
    group = make_group(right=1, wrong=1)
    group["rewards"] = [1.0, 1.0]
    check = verify_rollout(to_rollout_in(group), SAPO)
    assert list(check.verified_rewards) == [1.0, 0.0]


def test_a_dataset_outside_this_deployments_catalogue_is_unknown():
    group = make_group("bf", catalogue=SAPO)
    assert verify_rollout(to_rollout_in(group), EASY).reason == "unknown_task"


def test_has_variance():
    assert has_variance([1.0, 0.0])
    assert not has_variance([0.0, 0.0])
    assert not has_variance([])
