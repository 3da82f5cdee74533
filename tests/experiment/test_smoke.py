"""The smoke preset end to end: all four configurations, the real platform (PostgreSQL from
DATABASE_URL or the embedded one, daphne serving /ws/node/ from this checkout, real WebSockets),
and the outputs a reader opens."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict

import pytest

from research.analysis import ROUND_FIELDS
from research.presets import PAPER_CONFIGS, preset
from research.study import run_study
from sapo_node.outbox import Outbox

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    config = preset("smoke", out=str(out), database_url=os.environ.get("DATABASE_URL", ""))
    summary = run_study(config, progress=False)
    return config, out, summary


def read_csv(path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rounds_csv_has_a_row_per_node_per_round_of_every_configuration(smoke):
    config, out, _ = smoke
    rows = read_csv(out / "rounds.csv")
    with (out / "rounds.csv").open() as f:
        assert tuple(next(csv.reader(f))) == ROUND_FIELDS
    assert len(rows) == len(PAPER_CONFIGS) * len(config.seeds) * config.nodes * config.rounds == 16
    assert sorted({r["config"] for r in rows}) == sorted(PAPER_CONFIGS)
    scaled = {(r["config"], r["local"], r["external"]) for r in rows}
    assert scaled == {("8/0", "4", "0"), ("6/2", "3", "1"), ("4/4", "2", "2"), ("2/6", "1", "3")}
    for r in rows:
        assert 0.0 <= float(r["reward_mean"]) <= 1.0
        assert int(r["completions"]) == config.questions * config.generations
        assert int(r["external_kept"]) <= int(r["external"]) and int(r["local_kept"]) <= int(r["local"])


def test_every_share_reached_the_real_pool_and_every_external_group_verified(smoke):
    config, out, _ = smoke
    outboxes = sorted((out / "runs").glob("*/node-*/outbox.sqlite3"))
    assert len(outboxes) == 4 * config.nodes
    for path in outboxes:
        outbox = Outbox(path)
        try:
            # The pool re-verified every group the node shared (B per round) and accepted it.
            assert outbox.counts() == {
                "accepted": config.rounds * config.questions,
                "rejected": 0,
                "refused": 0,
                "pending": 0,
            }
        finally:
            outbox.close()
    rows = read_csv(out / "rounds.csv")
    assert all(int(r["external_invalid"]) == 0 and int(r["rejected"]) == 0 for r in rows)
    assert all(int(r["external_offered"]) == 0 for r in rows if r["config"] == "8/0")


def test_configurations_differ_only_in_local_and_external_counts(smoke):
    config, out, _ = smoke
    rows = read_csv(out / "rounds.csv")
    questions = defaultdict(dict)
    for r in rows:
        questions[(r["seed"], r["node"], r["round"])][r["config"]] = r["questions"]
    assert len(questions) == len(config.seeds) * config.nodes * config.rounds
    for key, by_config in questions.items():
        assert len(by_config) == 4 and len(set(by_config.values())) == 1, key
        refs = next(iter(by_config.values())).split(";")
        assert len(refs) == config.questions and all(len(ref.split("/")) == 3 for ref in refs)
    # Different nodes draw different questions.
    assert questions[("1", "1", "1")]["8/0"] != questions[("1", "2", "1")]["8/0"]
    # Same initial weights and the same per-node sampling RNG: round 1 (before any update or
    # external group could matter) generates the same completions, hence the same rewards.
    first = defaultdict(set)
    for r in rows:
        if r["round"] == "1":
            first[(r["seed"], r["node"])].add((r["reward_mean"], r["reward_std"]))
    assert all(len(v) == 1 for v in first.values()), first

    # The nodes' saved configs (sapo-node run's config.json) agree on everything else.
    saved = defaultdict(list)
    for path in sorted((out / "runs").glob("*/node-*/config.json")):
        node_config = json.loads(path.read_text())
        saved[path.parent.name].append(
            {k: v for k, v in node_config.items() if k not in ("local", "external", "out", "server")}
        )
    assert sorted(saved) == ["node-1", "node-2"]
    for node, configs in saved.items():
        assert len(configs) == 4 and all(c == configs[0] for c in configs), node


def test_table_plots_significance_and_summary_are_written(smoke):
    config, out, summary = smoke
    table = read_csv(out / "table.csv")
    assert [r["config"] for r in table] == list(PAPER_CONFIGS)
    assert table[0]["gain_pct"] == "" and all(r["gain_pct"] != "" for r in table[1:])
    md = (out / "table.md").read_text().strip().splitlines()
    assert len(md) == 2 + 4 and all(line.startswith(f"| {c} |") for line, c in zip(md[2:], PAPER_CONFIGS, strict=True))
    for name in ("rewards.png", "significance.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000
    sig = read_csv(out / "significance.csv")
    comparisons = {r["comparison"] for r in sig}
    assert comparisons == {"6/2 vs 8/0", "4/4 vs 8/0", "2/6 vs 8/0", "swarm (pooled) vs 8/0"}
    assert sorted(int(r["round"]) for r in sig if r["comparison"] == "4/4 vs 8/0") == [1, 2]
    assert all(0.0 <= float(r["p"]) <= float(r["p_adj"]) <= 1.0 for r in sig)
    saved = json.loads((out / "summary.json").read_text())
    assert saved["baseline"] == "8/0" and saved["rounds"] == config.rounds
    assert len(saved["meta"]["run_seconds"]) == 4 and saved["meta"]["study"]["preset"] == "smoke"
    assert summary["table"][0]["config"] == "8/0"


def test_held_out_accuracy_before_and_after_is_the_exports_evaluation(smoke):
    config, out, summary = smoke
    from sapo_node.models import load_policy
    from sapo_node.tasks import EASY_CATALOGUE
    from sapo_node.tiny.evaluation import evaluate

    rows = read_csv(out / "heldout.csv")
    datasets = [spec.dataset for spec in EASY_CATALOGUE.tasks]
    before = [r for r in rows if r["stage"] == "before"]
    assert [r["dataset"] for r in before] == datasets and {r["model"] for r in before} == {"tiny-mini"}
    after = {(r["config"], r["node"], r["dataset"]) for r in rows if r["stage"] == "after"}
    assert after == {(c, str(k), d) for c in PAPER_CONFIGS for k in (1, 2) for d in datasets}
    assert all(int(r["n"]) == config.heldout == 4 and 0 <= float(r["accuracy"]) <= 1 for r in rows)
    # The initial policy's scores are what `sapo-node export` computes for the same questions.
    model, tokenizer, _ = load_policy("tiny-mini", device="cpu")
    exported = evaluate(model, tokenizer, n=config.heldout, max_new_tokens=config.max_new_tokens)
    assert {r["dataset"]: float(r["accuracy"]) for r in before} == pytest.approx(exported, abs=1e-6)
    endpoints = (out / "endpoints.md").read_text()
    assert "Held-out accuracy, greedy, 4 questions per dataset" in endpoints and "| after 4/4 |" in endpoints
    held = json.loads((out / "summary.json").read_text())["heldout"]
    assert sorted(held["runs"]) == sorted(PAPER_CONFIGS) and set(held["paired"]) == {"6/2", "4/4", "2/6"}
    assert held["before"]["tiny-mini"]["accuracy"] == pytest.approx(sum(exported.values()) / 4, abs=1e-6)
