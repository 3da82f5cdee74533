"""Judging a peer's completions against this node's own reward (external_baseline = own)."""

from __future__ import annotations

import random

import pytest
import torch
from node_toys import collate, make_policy

from research.presets import StudyConfig, node_options
from sapo_node.assemble import assemble
from sapo_node.baseline import MAX_ADVANTAGE, OwnBaseline
from sapo_node.config import NodeConfig
from sapo_node.generate import encode_prompt
from sapo_node.groups import Group, TrainGroup
from sapo_node.grpo import baseline_advantages, grpo_update, token_logprobs, train_group_advantages
from sapo_node.prompts import format_prompt
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry


def _group(dataset: str, rewards: list[float], index: int = 0) -> Group:
    return Group(f"g-{dataset}-{index}", 1, TaskRef(dataset, 7, index), "q", "a", ["x"] * len(rewards), rewards)


def test_the_baseline_is_a_moving_average_of_the_nodes_own_reward_per_dataset():
    baseline = OwnBaseline(decay=0.5)
    assert baseline.get("basic_arithmetic") is None  # never answered: no baseline
    baseline.observe([_group("basic_arithmetic", [1, 0, 0, 0]), _group("basic_arithmetic", [1, 1, 0, 0], 1)])
    assert baseline.get("basic_arithmetic") == pytest.approx(0.375)  # the round's mean per question
    baseline.observe([_group("basic_arithmetic", [1, 1, 1, 1]), _group("base_conversion", [0, 0, 0, 0])])
    assert baseline.get("basic_arithmetic") == pytest.approx(0.5 * 0.375 + 0.5 * 1.0)
    assert baseline.get("base_conversion") == 0.0  # uninformative own groups count: the node fails there


def test_against_a_baseline_the_advantages_do_not_sum_to_zero_and_are_bounded():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    group_adv = train_group_advantages(TrainGroup("g", "external", [1], [[2]] * 4, rewards.tolist()))
    own_adv = train_group_advantages(TrainGroup("g", "external", [1], [[2]] * 4, rewards.tolist(), baseline=0.0))
    assert sum(group_adv) == pytest.approx(0.0, abs=1e-5)
    assert own_adv[3] == 0.0 and all(a > 0 for a in own_adv[:3])  # every success is news to this node
    assert own_adv[0] == pytest.approx(1.0 / (rewards.std().item() + 1e-4))
    # A node that masters the task (baseline 1): the peer's failure is pushed down, its successes not up.
    master = baseline_advantages(rewards, 1.0)
    assert master[:3].tolist() == [0.0, 0.0, 0.0] and master[3] < 0
    # Rewards that barely differ cannot blow the advantage up.
    tiny = baseline_advantages(torch.tensor([0.50, 0.51, 0.50, 0.51]), 0.0)
    assert tiny.max().item() == MAX_ADVANTAGE


def test_assemble_gives_external_groups_the_nodes_baseline_and_own_groups_none():
    _, tok = make_policy("a")
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    entry = build_entry(spec, 7, 3)
    right, wrong = f" <answer>{entry['answer']}</answer>", " <answer>-999</answer>"
    peer = Group(
        "ext",
        1,
        TaskRef("basic_arithmetic", 7, 3),
        entry["question"],
        entry["answer"],
        [right, wrong, right, wrong],
        [1.0, 0.0, 1.0, 0.0],
        node="peer",
    )
    baseline = OwnBaseline()
    baseline.observe([_group("basic_arithmetic", [0.0, 0.0, 0.0, 0.25])])

    def run(b):
        return assemble(
            [],
            [peer],
            n_local=0,
            n_external=1,
            rng=random.Random(0),
            catalogue=EASY_CATALOGUE,
            tokenizer=tok,
            format_prompt=format_prompt,
            max_tokens=64,
            baseline=b,
        )

    (judged,), _ = run(baseline)
    (plain,), _ = run(None)
    assert judged.baseline == pytest.approx(0.0625) and plain.baseline is None
    other = OwnBaseline()
    other.observe([_group("base_conversion", [1.0, 0.0])])
    (unknown,), _ = run(other)
    assert unknown.baseline is None  # a task this node never answered keeps the group's mean


def _logprob(model, prompt, completion):
    with torch.no_grad():
        batch = collate([(prompt, completion, 0.0)], 0, "cpu")
        return token_logprobs(model, batch.input_ids, batch.attention_mask, len(completion)).sum().item()


def test_a_peers_success_at_a_task_this_node_fails_at_is_learned_whole_only_against_its_own_baseline():
    """The peer's completions all share a form ("Yes"/"No") the receiver never uses; three are right.
    Within the group, the form is pushed up by the right ones as much as down by the wrong one; against
    the receiver's own reward on the task (0), only the right answer is pushed, and up."""
    gains = {}
    for label, baseline in (("group", None), ("own", 0.0)):
        model, tok = make_policy("a", seed=3)
        prompt = encode_prompt(tok, "Question: Was 2024 a leap year?\nAnswer:")
        yes = tok(" <answer>Yes</answer>", add_special_tokens=False)["input_ids"]
        no = tok(" <answer>No</answer>", add_special_tokens=False)["input_ids"]
        group = TrainGroup("g", "external", prompt, [yes, yes, yes, no], [1.0, 1.0, 1.0, 0.0], baseline=baseline)
        before = _logprob(model, prompt, yes)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(5):
            grpo_update(model, optimizer, [group], pad_id=tok.pad_token_id)
        gains[label] = _logprob(model, prompt, yes) - before
    assert gains["own"] > 0
    assert gains["own"] > 2 * gains["group"]  # in nats of log-probability of the right answer


def test_the_setting_is_a_run_flag_and_a_study_configuration():
    assert NodeConfig(external_baseline="own").resolved().external_baseline == "own"
    with pytest.raises(ValueError, match="external_baseline"):
        NodeConfig(external_baseline="peer").resolved()
    assert node_options("4/4+own") == {"ratio": "fixed", "external_baseline": "own"}
    assert node_options("auto+own") == {"ratio": "adaptive", "external_baseline": "own"}
    assert node_options("4/4") == {"ratio": "fixed", "external_baseline": "group"}
    cfg = StudyConfig(questions=4, configs=["8/0", "4/4", "4/4+own"])
    assert cfg.counts() == [("8/0", 4, 0), ("4/4", 2, 2), ("4/4+own", 2, 2)]
    cfg.validate()
