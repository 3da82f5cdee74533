"""The pre-registered endpoints on a synthetic rounds.csv: the learning ratio, the paired gain of a
swarm configuration over the silo with its interval and test, and rewards per node and dataset."""

from __future__ import annotations

import pytest
from test_analysis import make_row

from research.endpoints import dataset_rewards, endpoints, endpoints_markdown, learning, paired_endpoint


def _run(config: str, seed: int, rewards: list[float]) -> list[dict]:
    return [make_row(config, seed, 1, r, x) for r, x in enumerate(rewards, start=1)]


def test_learning_compares_the_first_and_last_rounds():
    rows = _run("8/0", 1, [0.1, 0.1, 0.2, 0.3, 0.3, 0.3])  # span 3 of 6 rounds: 0.133 -> 0.3
    result = learning(rows, span=20)
    assert result["8/0"][1]["first"] == pytest.approx(0.4 / 3)
    assert result["8/0"][1]["ratio"] == pytest.approx(0.3 / (0.4 / 3))


def test_paired_gain_by_hand():
    rows = []
    for seed, (silo, swarm) in enumerate([(1.0, 1.1), (2.0, 2.3), (1.0, 1.2), (2.0, 1.6)], start=1):
        rows += _run("8/0", seed, [silo]) + _run("4/4", seed, [swarm])
    result = paired_endpoint(rows, "4/4")
    assert result["gain_pct"] == pytest.approx({1: 10.0, 2: 15.0, 3: 20.0, 4: -20.0})
    assert result["gain_pct_mean"] == pytest.approx(6.25) and result["seeds_gaining"] == 3
    low, high = result["ci95_pct"]
    assert (high - low) / 2 == pytest.approx(3.182446 * 17.97105 / 2, rel=1e-4)  # t(0.975, 3) * sd / sqrt(4)
    # Differences +0.1, +0.3, +0.2, -0.4: ranks 1, 3, 2, 4, W- = 4; 7 of 16 sign patterns give W <= 4.
    assert result["wilcoxon_p"] == pytest.approx(14 / 16)
    assert paired_endpoint(_run("8/0", 1, [1.0]), "4/4") is None


def test_rewards_per_node_and_dataset_come_from_the_per_question_rewards():
    rows = []
    for r in (1, 2):
        row = make_row("8/0", 1, 2, r, 0.0)
        row["questions"] = "basic_arithmetic/1/1;base_conversion/1/2"
        row["question_rewards"] = f"{0.5 * r:.4f};0.0000"
        rows.append(row)
    result = dataset_rewards(rows)
    assert result["8/0"][2]["basic_arithmetic"] == {"first": 0.5, "last": 1.0, "all": 0.75}
    assert result["8/0"][2]["base_conversion"]["all"] == 0.0


def test_the_markdown_names_every_configuration():
    rows = []
    for seed in (1, 2):
        rows += _run("8/0", seed, [0.1, 0.2]) + _run("4/4", seed, [0.2, 0.3])
    text = endpoints_markdown(endpoints(rows))
    assert "| 8/0 |" in text and "| 4/4 | 2 |" in text and "2/2" in text


def test_transfer_is_the_reward_on_the_datasets_a_nodes_warm_start_does_not_know():
    from research.endpoints import node_known, transfer

    known = node_known({"study": {"model": "tiny-learn-a,tiny-learn-b", "nodes": 2}})
    assert known == {
        1: frozenset({"basic_arithmetic", "calendar_arithmetic"}),
        2: frozenset({"base_conversion", "fraction_simplification"}),
    }
    assert node_known({"study": {"model": "tiny-learn", "nodes": 2}}) == {}  # knows everything: no transfer

    rows = []
    for seed, (silo, swarm) in enumerate([(0.0, 0.5), (0.25, 0.75)], start=1):
        for config, other in (("8/0", silo), ("4/4+own", swarm)):
            for node, (own_ds, other_ds) in (
                (1, ("basic_arithmetic", "base_conversion")),
                (2, ("fraction_simplification", "calendar_arithmetic")),
            ):
                row = make_row(config, seed, node, 1, 0.5)
                row["questions"] = f"{own_ds}/1/1;{other_ds}/1/2"
                row["question_rewards"] = f"1.0000;{other:.4f}"  # own tasks: always right, not counted
                rows.append(row)
    result = transfer(rows, known)
    assert result["8/0"]["runs"] == {1: {"all": 0.0, "last": 0.0}, 2: {"all": 0.25, "last": 0.25}}
    assert result["4/4+own"]["runs"][2] == {"all": 0.75, "last": 0.75}
    paired = result["4/4+own"]["paired"]
    assert paired["seeds_gaining"] == 2 and paired["gain_pct_of_means"] == pytest.approx(400.0)
    text = endpoints_markdown(endpoints(rows, known=known))
    assert "does not know" in text and "| 4/4+own | 0.500 / 0.500 | 0.750 / 0.750 |" in text


def test_generation_cost_counts_completions_until_the_moving_average_reaches_a_level():
    rows = []
    for config, rewards in (("8/0", [0.1, 0.2, 0.3, 0.4]), ("4/4", [0.3, 0.2, 0.2, 0.2])):
        for node, shift in ((1, 0.0), (2, 0.1)):
            for r, x in enumerate(rewards, start=1):
                rows.append({**make_row(config, 1, node, r, x + shift), "completions": 16})
    # Node means per round: 8/0 0.15 0.25 0.35 0.45; 4/4 0.35 0.25 0.25 0.25. Moving average (2 rounds):
    # 8/0 0.15 0.20 0.30 0.40; 4/4 0.35 0.30 0.25 0.25.
    result = endpoints(rows, window=2, cost_levels=[0.3, 0.4])["generation_cost"]
    assert result["runs"]["8/0"][1] == {0.3: 3 * 2 * 16, 0.4: 4 * 2 * 16}
    assert result["runs"]["4/4"][1] == {0.3: 1 * 2 * 16, 0.4: None}
    table = endpoints_markdown(endpoints(rows, window=2, cost_levels=[0.3, 0.4]))
    assert "| 4/4 | 0.3 | 32 | 32 |" in table and "| 4/4 | 0.4 | not reached |  |" in table
    assert endpoints(rows)["generation_cost"] is None  # no levels, no table


def test_learning_zone_share_and_its_paired_difference_by_hand():
    rows = []
    # Per run, four own groups: silo 1 of 4 in the zone (0.25 and 0, 0, 1), swarm 2 of 4; seed 2: 0 and 3 of 4.
    shares = {("8/0", 1): "0.2500;0.0000;0.0000;1.0000", ("4/4", 1): "0.5000;0.7500;0.0000;1.0000"}
    shares |= {("8/0", 2): "0.0000;0.0000;1.0000;0.0000", ("4/4", 2): "0.2500;0.2500;0.5000;1.0000"}
    for (config, seed), rewards in shares.items():
        row = make_row(config, seed, 1, 1, 0.1)
        row["questions"] = ";".join(f"basic_arithmetic/{seed}/{i}" for i in range(4))
        row["question_rewards"] = rewards
        rows.append(row)
    result = endpoints(rows)["learning_zone"]
    assert result["runs"] == {"8/0": {1: 0.25, 2: 0.0}, "4/4": {1: 0.5, 2: 0.75}}
    paired = result["paired"]["4/4"]
    assert paired["diff_points"] == [25.0, 75.0] and paired["mean_points"] == pytest.approx(50.0)
    assert paired["sd_points"] == pytest.approx(35.355339) and paired["seeds_gaining"] == 2
    assert "Learning zone" in endpoints_markdown(endpoints(rows))


def test_the_paired_gain_gives_its_spread():
    rows = []
    for seed, (silo, swarm) in enumerate([(1.0, 1.1), (2.0, 2.3), (1.0, 1.2), (2.0, 1.6)], start=1):
        rows += _run("8/0", seed, [silo]) + _run("4/4", seed, [swarm])
    assert paired_endpoint(rows, "4/4")["gain_pct_sd"] == pytest.approx(17.969882)
