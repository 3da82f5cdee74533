"""The held-out evaluation's rows and their analysis (heldout.csv -> endpoints.md, summary.json)."""

from __future__ import annotations

import pytest

from research.heldout import heldout_rows, keep_rows, markdown, read_heldout, summarise, write_heldout

SILO = {1: 0.20, 2: 0.30, 3: 0.40}
SWARM = {1: 0.25, 2: 0.33, 3: 0.38}  # +5, +3, -2 accuracy points


def study_rows() -> list[dict]:
    def scores(accuracy: float, parsed: float = 1.0) -> dict:
        # Two datasets whose mean is `accuracy`.
        return {
            "basic_arithmetic": {"accuracy": accuracy + 0.1, "parsed": parsed, "seconds": 1.0},
            "base_conversion": {"accuracy": accuracy - 0.1, "parsed": parsed, "seconds": 1.0},
        }

    rows = heldout_rows(scores(0.15, 0.5), stage="before", model="m", n=10)
    for config, by_seed in (("8/0", SILO), ("4/4", SWARM)):
        for seed, accuracy in by_seed.items():
            for node in (1, 2):
                rows += heldout_rows(
                    scores(accuracy), stage="after", model="m", n=10, config=config, seed=seed, node=node
                )
    return rows


def test_csv_round_trip(tmp_path):
    path = tmp_path / "heldout.csv"
    rows = study_rows()
    write_heldout(path, rows[:4])
    write_heldout(path, rows[4:], append=True)
    assert read_heldout(path) == rows


def test_paired_difference_from_the_silo_by_hand():
    result = summarise(study_rows(), "8/0", ["8/0", "4/4"])
    assert result["before"]["m"] == {"accuracy": pytest.approx(0.15), "parsed": 0.5, "policies": 1}
    assert result["runs"]["4/4"][1]["accuracy"] == pytest.approx(0.25)
    assert result["runs"]["8/0"][3]["policies"] == 2
    assert result["datasets"]["4/4"]["basic_arithmetic"]["accuracy"] == pytest.approx(0.32 + 0.1)
    paired = result["paired"]["4/4"]
    assert paired["diff_points"] == pytest.approx([5.0, 3.0, -2.0])
    assert paired["mean_points"] == pytest.approx(2.0) and paired["seeds_gaining"] == 2
    assert paired["sd_points"] == pytest.approx(3.605551)
    assert paired["wilcoxon_p"] == pytest.approx(0.5)  # ranks 3, 2, 1: W- = 1, 2 of 8 sign patterns as extreme
    low, high = paired["ci95_points"]
    assert low < 2.0 < high and high - low == pytest.approx(2 * 4.302653 * 3.605551 / 3**0.5, rel=1e-5)
    table = markdown(result)
    assert "| before (m) | 0.150 (0.50) |" in table and "| 4/4 | 3 | +5.0, +3.0, -2.0 | +2.0 |" in table


def test_a_run_cut_short_loses_its_rows_and_the_initial_policy_is_kept_once():
    rows = study_rows()
    kept = keep_rows(rows + rows[:2], {("8/0", 1), ("8/0", 2), ("8/0", 3), ("4/4", 1)})
    assert len([r for r in kept if r["stage"] == "before"]) == 2
    assert {(r["config"], r["seed"]) for r in kept if r["stage"] == "after"} == {
        ("8/0", 1),
        ("8/0", 2),
        ("8/0", 3),
        ("4/4", 1),
    }
    # Without the silo's seed, no pair.
    result = summarise([r for r in kept if r["config"] != "8/0" or r["seed"] != 1], "8/0", ["8/0", "4/4"])
    assert "4/4" not in result["paired"]


def test_a_runs_policies_evaluated_side_by_side_answer_as_each_alone(
    tmp_path, tiny_policy, tiny_mini_policy, monkeypatch
):
    """At a run's end its nodes' policies are evaluated at once, one a core; the rows are the ones each
    policy's evaluation gives alone (greedy, the same operations), so the endpoint does not depend on it.
    Two models with two tokenizers: each evaluation keeps a tokenizer of its own."""
    from types import SimpleNamespace

    import torch

    from research import study
    from research.presets import preset

    cfg = preset("cpu-swarm", heldout=6, max_new_tokens=16)
    nodes = [
        SimpleNamespace(index=k, config=SimpleNamespace(model=name), node=SimpleNamespace(model=m, tokenizer=t))
        for k, (name, (m, t)) in enumerate((("tiny", tiny_policy), ("tiny-mini", tiny_mini_policy)), start=1)
    ]
    alone = []
    for node in nodes:
        where = {"stage": "after", "model": node.config.model, "config": "4/4", "seed": 3, "node": node.index}
        alone += study._evaluate(cfg, node.node.model, node.node.tokenizer, **where)

    threads, evaluate = set(), study._evaluate

    def recorded(*args, **kwargs):
        import threading

        threads.add(threading.current_thread().name)
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(study, "_evaluate", recorded)
    monkeypatch.setattr(study, "cpu_threads", lambda: 2)  # two cores, whatever this machine has
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        study.evaluate_final(cfg, nodes, tmp_path, label="4/4", seed=3)
    finally:
        torch.set_num_threads(before)
    assert len(threads) == 2 and all(name.startswith("heldout") for name in threads)  # side by side

    def answers(rows):
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]

    together = read_heldout(tmp_path / "heldout.csv")
    assert answers(together) == answers(alone)
    assert {row["model"] for row in together} == {"tiny", "tiny-mini"} and len(together) == 2 * len(
        cfg.task_catalogue().tasks
    )
    assert any(row["accuracy"] > 0 for row in together)  # scored answers, not empty ones
