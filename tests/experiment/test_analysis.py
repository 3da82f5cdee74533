"""The study's analysis on a synthetic rounds.csv: hand-computed sums and gains, the per-round test
on clearly separated and on identical rewards, and the files a reader opens."""

from __future__ import annotations

import csv
import json
import math

import pytest

from research import main as experiment_main
from research.analysis import (
    ROUND_FIELDS,
    analyse,
    benjamini_hochberg,
    compare,
    cumulative_by_run,
    markdown_table,
    moving_average,
    read_rounds,
    significance,
    summary_table,
    write_rounds,
)
from research.presets import parse_config, preset

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_row(config: str, seed: int, node: int, round: int, reward: float) -> dict:
    local, external = parse_config(config)
    row = {name: 0 for name in ROUND_FIELDS}
    row.update(
        config=config,
        local=local,
        external=external,
        seed=seed,
        node=node,
        round=round,
        reward_mean=reward,
        questions=f"basic_arithmetic/{seed * 1000 + node}/{round}",
    )
    return row


# Rewards by (config, seed): per node, per round (2 nodes x 3 rounds).
REWARDS = {
    ("8/0", 1): [[0.1, 0.2, 0.3], [0.0, 0.1, 0.1]],  # total 0.8
    ("8/0", 2): [[0.2, 0.2, 0.2], [0.1, 0.1, 0.2]],  # total 1.0
    ("4/4", 1): [[0.2, 0.4, 0.6], [0.1, 0.2, 0.3]],  # total 1.8
    ("4/4", 2): [[0.3, 0.3, 0.3], [0.2, 0.2, 0.1]],  # total 1.4
}


@pytest.fixture
def rows() -> list[dict]:
    out = []
    for (config, seed), per_node in REWARDS.items():
        for node, rewards in enumerate(per_node, start=1):
            out.extend(make_row(config, seed, node, r, x) for r, x in enumerate(rewards, start=1))
    return out


def test_csv_round_trip_keeps_numbers_and_columns(tmp_path, rows):
    write_rounds(tmp_path / "rounds.csv", rows[:5])
    write_rounds(tmp_path / "rounds.csv", rows[5:], append=True)
    back = read_rounds(tmp_path / "rounds.csv")
    assert len(back) == len(rows) == 24
    assert back[0]["reward_mean"] == pytest.approx(0.1) and back[0]["round"] == 1 and back[0]["external"] == 0
    with (tmp_path / "rounds.csv").open() as f:
        assert tuple(next(csv.reader(f))) == ROUND_FIELDS


def test_cumulative_reward_and_gain_are_the_hand_computed_ones(rows):
    totals = cumulative_by_run(rows)
    assert totals["8/0"] == pytest.approx({1: 0.8, 2: 1.0})
    assert totals["4/4"] == pytest.approx({1: 1.8, 2: 1.4})

    silo, swarm = summary_table(rows)
    assert silo.config == "8/0" and silo.gain_pct is None
    assert silo.mean == pytest.approx(0.9) and silo.std == pytest.approx(math.sqrt(0.02))  # ddof 1
    assert swarm.mean == pytest.approx(1.6) and swarm.std == pytest.approx(math.sqrt(0.08))
    assert swarm.gain_pct == pytest.approx(100 * (1.6 / 0.9 - 1))  # +77.8%
    assert swarm.per_seed_gain_pct == pytest.approx({1: 125.0, 2: 40.0})
    assert swarm.paired_gain_pct_mean == pytest.approx(82.5)
    assert swarm.paper_gain_pct == pytest.approx(100 * (1093.31 / 561.79 - 1))  # the paper's +94.6%

    table = markdown_table([silo, swarm])
    lines = table.strip().splitlines()
    assert len(lines) == 4 and lines[2].startswith("| 8/0 |") and lines[3].startswith("| 4/4 |")
    assert "+77.8%" in lines[3] and "1.60 ± 0.28" in lines[3]


def test_moving_average_is_trailing_and_starts_at_the_first_round():
    assert moving_average([1, 2, 3, 4], 2) == pytest.approx([1.0, 1.5, 2.5, 3.5])
    assert moving_average([1, 2, 3, 4], 1) == pytest.approx([1, 2, 3, 4])


def test_benjamini_hochberg_by_hand():
    adjusted = benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    assert adjusted == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])
    assert benjamini_hochberg([0.9, 0.9]) == pytest.approx([0.9, 0.9])
    assert benjamini_hochberg([1.0]) == pytest.approx([1.0])


@pytest.mark.parametrize("method", ["mannwhitney", "welch", "wilcoxon"])
def test_the_test_separates_clearly_different_rewards_and_not_identical_ones(method):
    silo = [0.10, 0.12, 0.11, 0.09, 0.13, 0.10, 0.08, 0.12, 0.11, 0.10, 0.09, 0.12]
    swarm = [x + 0.5 for x in silo]
    _, p = compare(swarm, silo, method)
    assert p < 1e-3
    _, p_same = compare(silo, list(silo), method)
    assert p_same > 0.9
    _, p_flat = compare([0.0] * 6, [0.0] * 6, method)  # no spread at all: no evidence, not an error
    assert p_flat == 1.0


def _separated_study(gap: float) -> list[dict]:
    """8/0 and 4/4, 3 seeds x 4 nodes x 5 rounds; 4/4 is `gap` above 8/0 from round 3 on."""
    rows = []
    for config in ("8/0", "4/4"):
        for seed in (1, 2, 3):
            for node in range(1, 5):
                for r in range(1, 6):
                    base = 0.2 + 0.01 * node + 0.003 * seed
                    lift = gap if (config == "4/4" and r >= 3) else 0.0
                    rows.append(make_row(config, seed, node, r, base + lift))
    return rows


def test_significance_per_round_is_adjusted_over_rounds_and_finds_the_gap():
    sig = significance(_separated_study(0.5))
    assert [s.round for s in sig] == [1, 2, 3, 4, 5]  # one comparison (one swarm config): no pooled row
    assert all(s.comparison == "4/4 vs 8/0" and s.n_swarm == 12 and s.n_silo == 12 for s in sig)
    assert [s.significant for s in sig] == [False, False, True, True, True]
    assert all(s.p_adj >= s.p for s in sig)
    assert sig[0].p == pytest.approx(1.0)  # identical rewards in rounds 1 and 2


def test_the_paired_test_sees_a_small_consistent_lift_that_the_unpaired_one_misses():
    # Node rewards spread widely (different questions per node), but every 4/4 node beats its own
    # silo twin (same seed, node, questions) by a little: only the paired test can see it.
    rows = []
    for seed in (1, 2, 3):
        for node in range(1, 5):
            level = 0.1 * node + 0.03 * seed
            rows.append(make_row("8/0", seed, node, 1, level))
            rows.append(make_row("4/4", seed, node, 1, level + 0.02))
    (paired,) = significance(rows, method="wilcoxon")
    (unpaired,) = significance(rows, method="mannwhitney")
    assert paired.n_swarm == paired.n_silo == 12
    assert paired.p < 0.01 < 0.5 < unpaired.p


def test_pooled_comparison_when_there_are_several_swarm_configurations(rows):
    rows = rows + [make_row("2/6", s, n, r, 0.5) for s in (1, 2) for n in (1, 2) for r in (1, 2, 3)]
    sig = significance(rows)
    comparisons = sorted({s.comparison for s in sig})
    assert comparisons == ["2/6 vs 8/0", "4/4 vs 8/0", "swarm (pooled) vs 8/0"]
    pooled = [s for s in sig if s.comparison.startswith("swarm (pooled)")]
    assert len(pooled) == 3 and pooled[0].n_swarm == 8 and pooled[0].n_silo == 4


def test_analyse_writes_every_output(tmp_path):
    rows = _separated_study(0.5)
    summary = analyse(rows, tmp_path, window=2, meta={"note": "synthetic"})
    for name in ("rewards.png", "significance.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    table_md = (tmp_path / "table.md").read_text().strip().splitlines()
    assert len(table_md) == 2 + 2  # header, rule, one row per configuration
    with (tmp_path / "table.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["config"] for r in table] == ["8/0", "4/4"]
    with (tmp_path / "significance.csv").open() as f:
        sig = list(csv.DictReader(f))
    assert len(sig) == 5 and sig[2]["significant"] == "1"
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    assert saved["baseline"] == "8/0" and saved["rounds"] == 5 and saved["seeds"] == [1, 2, 3]
    assert saved["significance"]["first_significant_round"] == {"4/4 vs 8/0": 3}
    assert saved["table"][1]["gain_pct"] > 0 and saved["meta"] == {"note": "synthetic"}


def test_the_command_redoes_the_analysis_of_a_folder(tmp_path, capsys):
    write_rounds(tmp_path / "rounds.csv", _separated_study(0.3))
    publish = tmp_path / "published"
    assert experiment_main(["--analyze", str(tmp_path), "--window", "3", "--publish", str(publish)]) == 0
    assert "| 4/4 |" in capsys.readouterr().out
    assert (publish / "rewards.png").read_bytes().startswith(PNG_SIGNATURE)
    assert json.loads((publish / "summary.json").read_text())["moving_average_window"] == 3


def test_the_analysis_names_the_study_its_folder_plans_not_the_last_process_that_ran_there(tmp_path):
    write_rounds(tmp_path / "rounds.csv", _separated_study(0.3))
    preset("cpu-tiny", seeds=[1, 2], out=str(tmp_path)).save(tmp_path / "study.json")
    # The summary of a process that ran seed 2 only, as a resumed `--seeds 2` leaves it.
    (tmp_path / "summary.json").write_text(json.dumps({"meta": {"study": {"seeds": [2]}, "seconds": 60.0}}))

    assert experiment_main(["--analyze", str(tmp_path)]) == 0

    meta = json.loads((tmp_path / "summary.json").read_text())["meta"]
    assert meta["study"]["seeds"] == [1, 2] and meta["study"]["preset"] == "cpu-tiny" and meta["seconds"] == 60.0


def test_the_command_analyses_studies_together_and_a_subset_of_seeds_into_another_folder(tmp_path, capsys):
    first, second, merged = tmp_path / "fixed", tmp_path / "auto", tmp_path / "merged"
    for folder in (first, second):
        folder.mkdir()
    write_rounds(first / "rounds.csv", _separated_study(0.3))
    auto = [dict(row, config="auto", local=0, external=4) for row in _separated_study(0.3) if row["config"] == "4/4"]
    write_rounds(second / "rounds.csv", auto)
    assert experiment_main(["--analyze", f"{first},{second}", "--seeds", "1", "--out", str(merged)]) == 0
    rows = read_rounds(merged / "rounds.csv")
    assert {row["config"] for row in rows} == {"8/0", "4/4", "auto"} and {row["seed"] for row in rows} == {1}
    assert "| auto |" in capsys.readouterr().out
    before = (first / "rounds.csv").read_text()
    assert experiment_main(["--analyze", str(first), "--seeds", "1"]) == 2  # never over a study's own rounds.csv
    assert (first / "rounds.csv").read_text() == before
