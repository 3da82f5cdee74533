"""A study holds one run's nodes at a time: a real model's node is gigabytes (its weights, gradients and
optimizer state), and a study's runs go one after another in one process."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

from research import study
from research.presets import preset

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_runs_nodes_are_freed_before_the_next_run_starts(tmp_path, monkeypatch):
    cfg = preset(
        "smoke",
        out=str(tmp_path / "study"),
        database_url=os.environ.get("DATABASE_URL", ""),
        configs=["8/0"],
        seeds=[1, 2],
        rounds=1,
        heldout=0,
    )
    models: list[weakref.ref] = []  # each started node's own copy of the policy
    alive_when_a_run_starts: list[int] = []
    start_node, run_swarm = study.start_node, study.run_swarm

    def started(*args, **kwargs):
        node = start_node(*args, **kwargs)
        models.append(weakref.ref(node.node.model))
        return node

    def run(*args, **kwargs):
        alive_when_a_run_starts.append(sum(ref() is not None for ref in models))
        return run_swarm(*args, **kwargs)

    monkeypatch.setattr(study, "start_node", started)
    monkeypatch.setattr(study, "run_swarm", run)
    gc.disable()  # the collector runs when it pleases; what counts is what the study frees itself
    try:
        summary = study.run_study(cfg, progress=False)
    finally:
        gc.enable()

    assert [run["seed"] for run in summary["meta"]["run_seconds"]] == [1, 2]  # both runs finished
    assert len(models) == 2 * cfg.nodes
    assert alive_when_a_run_starts == [0, 0]
    assert [ref() for ref in models] == [None] * len(models)
