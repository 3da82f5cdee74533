"""Verification of groups full of hostile completions: what the server does with them, and how fast.

Groups for every SAPO dataset whose completions are the payloads found against the pool (an eval that
writes a file, `9**9**9`, 8,000 `¬`, huge numbers, NUL, lone surrogates, unclosed tags), through
pool.verification.verify_rollout as a share is verified; then the cheap checks' order, and a scorer
stopped by the sandbox's clock stored as `verification_timeout`.
"""

from __future__ import annotations

import time

import pytest
from support.pool import SAPO, default_swarm, make_group, to_rollout_in

from pool.ingest import rollout_share
from pool.models import Rollout, Verdict
from pool.verification import ACCEPTED, REJECTED, verify_rollout
from sapo_node.tasks import build_entry, score_completions
from sapo_node.verifiers import vetted

DATASETS = [spec.dataset for spec in SAPO.tasks]


def hostile_completions(marker) -> list[str]:
    return [
        f"<answer>__import__('pathlib').Path({str(marker)!r}).touch()</answer>",
        f"<answer>[[__import__('pathlib').Path({str(marker)!r}).touch()]]</answer>",
        "<answer>9**9**9</answer>",
        "<answer>" + "¬" * 8000 + "P</answer>",
        "<answer>" + "¬" * 250 + "P</answer>",
        "<answer>" + "(" * 4000 + "P" + ")" * 4000 + "</answer>",
        "<answer>" + "9" * 8000 + "</answer>",
        "<answer>" + " ∧ ".join(f"a{i}" for i in range(40)) + "</answer>",
        "<answer>\x00\x00</answer>",
        "<answer>\ud800/\udfff</answer>",
        "<answer>" * 1000,
    ]


def hostile_group(dataset: str, marker, *, seed: int = 77, index: int = 4) -> dict:
    """A group as an attacker would send it: the right question and answer (anyone can rebuild them),
    hostile completions, and claimed rewards that are what the pool's rule gives them."""
    group = make_group(dataset, seed=seed, index=index, right=0, wrong=0)
    spec = SAPO.get(dataset)
    entry = build_entry(spec, seed, index)
    right = entry["answer"] if entry["answer"] is not None else entry["metadata"]["example_answer"]
    group["completions"] = [f"<answer>{right}</answer>", *hostile_completions(marker)]
    group["rewards"] = score_completions(spec, seed, entry, group["completions"])
    return group


@pytest.mark.parametrize("dataset", DATASETS)
def test_a_hostile_group_is_verified_in_milliseconds_without_running_its_code(dataset, tmp_path):
    marker = tmp_path / "pwned"
    group = hostile_group(dataset, marker)
    start = time.perf_counter()
    check = verify_rollout(to_rollout_in(group), SAPO)
    elapsed = time.perf_counter() - start
    assert (check.verdict, check.reason) == (ACCEPTED, "")
    assert check.verified_rewards[0] == 1.0  # the honest completion still scores
    assert list(check.verified_rewards) == group["rewards"]
    assert elapsed < 0.25  # 12 completions; reasoning-gym took seconds on several of these alone
    assert not marker.exists()


@pytest.mark.parametrize("forge", ["question", "answer"])
def test_a_forged_group_is_rejected_before_any_completion_is_scored(forge, tmp_path):
    group = hostile_group("basic_arithmetic", tmp_path / "pwned")
    group[forge] = "What is 2 + 2?" if forge == "question" else "4"
    check = verify_rollout(to_rollout_in(group), SAPO)
    assert (check.verdict, check.reason, check.verified_rewards) == (REJECTED, f"{forge}_mismatch", None)


@pytest.fixture
def logic_changed(monkeypatch):
    """As if reasoning-gym's propositional_logic scorer had changed since review and ours were gone:
    the dataset is scored by reasoning-gym's quadratic parser, in the sandbox (0.5 s per answer)."""
    monkeypatch.setitem(
        vetted.VERIFIERS, "propositional_logic", vetted.Verifier(1024, reviewed={"score_answer": "0" * 16})
    )
    monkeypatch.setattr(vetted, "_reviewed_classes", {})


def slow_logic_group() -> dict:
    group = make_group("propositional_logic", seed=5, index=11, right=0, wrong=0)
    group["completions"] = ["<answer>P</answer>", "<answer>" + "¬" * 1000 + "P</answer>"]
    group["rewards"] = [0.25, 0.0]
    return group


def test_a_completion_that_runs_out_of_time_rejects_its_group(logic_changed):
    check = verify_rollout(to_rollout_in(slow_logic_group()), SAPO)
    assert (check.verdict, check.reason) == (REJECTED, "verification_timeout")
    assert len(check.verified_rewards) == 2 and check.verified_rewards[1] == 0.0


def test_the_question_check_comes_before_the_sandbox(logic_changed):
    """The same slow group with a forged question costs nothing: it is never scored."""
    group = slow_logic_group()
    group["question"] = "What follows from nothing?"
    start = time.perf_counter()
    check = verify_rollout(to_rollout_in(group), SAPO)
    assert (check.verdict, check.reason) == (REJECTED, "question_mismatch")
    assert time.perf_counter() - start < 0.2


def test_a_timed_out_group_is_stored_in_the_rejection_inbox(db, node, logic_changed):
    group = slow_logic_group()
    result = rollout_share(node=node, rollouts=[to_rollout_in(group)], catalogue=SAPO, swarm=default_swarm())
    assert result.rejected == [{"id": group["id"], "reason": "verification_timeout"}]
    row = Rollout.objects.get(id=group["id"])
    assert (row.verdict, row.reason, row.sampleable) == (Verdict.REJECTED, "verification_timeout", False)
