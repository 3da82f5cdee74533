"""The adaptive local/external policy: J fills the own slots that carry no signal, one more when
peers do better than the node, one fewer when they do worse."""

from __future__ import annotations

from sapo_node.groups import Group
from sapo_node.ratio import AdaptiveRatio
from sapo_node.tasks import TaskRef


def _group(rewards: list[float]) -> Group:
    return Group.new(
        round=1,
        task=TaskRef("basic_arithmetic", 1, 0),
        question="q",
        answer="1",
        completions=["c"] * len(rewards),
        rewards=rewards,
    )


MIXED, FAILED = _group([0.0, 1.0]), _group([0.0, 0.0])


def test_empty_own_slots_go_to_the_swarm():
    ratio = AdaptiveRatio(total=4, max_external=4)
    assert ratio.choose([MIXED, MIXED, MIXED, MIXED]) == (4, 0)
    assert ratio.choose([MIXED, FAILED, FAILED, MIXED]) == (2, 2)
    assert ratio.choose([FAILED] * 4) == (0, 4)
    assert AdaptiveRatio(total=4, max_external=1).choose([FAILED] * 4) == (3, 1)


def test_peers_that_do_better_get_a_slot_and_peers_that_do_worse_lose_one():
    better = AdaptiveRatio(total=4, max_external=4)
    better.observe([_group([0.0, 0.0, 0.0, 1.0])], external_rewards=[1.0, 0.0])  # own 0.25, peers 0.5
    assert better.choose([MIXED, MIXED, FAILED, FAILED]) == (1, 3)

    worse = AdaptiveRatio(total=4, max_external=4)
    worse.observe([_group([1.0, 1.0, 0.0, 1.0])], external_rewards=[0.0, 0.0, 1.0])  # own 0.75, peers 0.33
    assert worse.choose([MIXED, MIXED, FAILED, FAILED]) == (3, 1)
    assert worse.choose([MIXED] * 4) == (4, 0)  # never below 0


def test_the_averages_move_by_the_decay_and_compare_like_with_like():
    ratio = AdaptiveRatio(total=4, max_external=4, decay=0.5)
    ratio.observe([_group([1.0, 0.0]), FAILED], external_rewards=[1.0])  # own: informative groups only
    assert ratio.own_reward == 0.5
    ratio.observe([_group([0.0, 1.0, 1.0, 1.0])], external_rewards=[])  # nothing received: peers' average stays
    ratio.observe([FAILED], external_rewards=[0.0])  # no informative own group: own average stays
    assert ratio.own_reward == 0.625 and ratio.external_reward == 0.5
