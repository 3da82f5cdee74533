"""Presets, the scaling of configurations, and the question streams that every configuration shares."""

from __future__ import annotations

import pytest

from research import main as experiment_main
from research.presets import node_options, preset
from research.study import node_config, node_seed
from research.swarm import StratifiedTaskStream
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE


def test_configurations_are_scaled_to_the_training_groups_per_round():
    assert preset("cpu-tiny").counts() == [("8/0", 4, 0), ("6/2", 3, 1), ("4/4", 2, 2), ("2/6", 1, 3)]
    assert preset("gpu-qwen").counts() == [("8/0", 8, 0), ("6/2", 6, 2), ("4/4", 4, 4), ("2/6", 2, 6)]


def test_gpu_qwen_is_the_papers_setting():
    cfg = preset("gpu-qwen")
    assert (cfg.model, cfg.nodes, cfg.questions, cfg.generations, cfg.catalogue) == (
        "Qwen/Qwen2.5-0.5B-Instruct",
        8,
        8,
        8,
        "sapo",
    )
    assert (cfg.device, cfg.dtype) == ("auto", "auto")  # bfloat16 on CUDA (sapo_node.models.resolve_dtype)


def test_impossible_studies_are_refused():
    with pytest.raises(ValueError, match="local groups"):
        preset("cpu-tiny", groups=8)  # 8/0 needs 8 own groups but B = 4
    with pytest.raises(ValueError, match="LOCAL/EXTERNAL"):
        preset("smoke", configs=["8-0"])
    assert experiment_main(["--preset", "smoke", "--configs", "4/4,4/4"]) == 2


def test_a_node_draws_one_question_per_distinct_dataset_deterministically():
    a = StratifiedTaskStream(SAPO_CATALOGUE, node_seed(1, 3)).draw(8)
    b = StratifiedTaskStream(SAPO_CATALOGUE, node_seed(1, 3)).draw(8)
    assert a == b
    assert len({ref.dataset for ref in a}) == 8  # 8 of the 9 specialties, one question each
    other = StratifiedTaskStream(SAPO_CATALOGUE, node_seed(1, 4)).draw(8)
    assert {r.index for r in other}.isdisjoint({r.index for r in a})

    easy = StratifiedTaskStream(EASY_CATALOGUE, 7)
    first, second = easy.draw(4), easy.draw(4)
    assert len({r.dataset for r in first}) == 4 and first != second
    assert len(easy.draw(6)) == 6  # more questions than datasets: cycles through a fresh shuffle


def test_cpu_learn_is_two_nodes_of_the_learning_model_on_one_thread():
    cfg = preset("cpu-learn", seeds=[1, 2, 3])
    assert (cfg.model, cfg.nodes, cfg.rounds, cfg.threads, cfg.max_new_tokens) == ("tiny-learn", 2, 80, 1, 16)
    assert cfg.counts()[2] == ("4/4", 2, 2)


def test_nodes_take_the_given_models_in_turn_and_auto_is_the_adaptive_configuration():
    cfg = preset("cpu-skills", nodes=3, configs=["8/0", "auto"])
    assert cfg.node_models() == ["tiny-learn-a", "tiny-learn-b", "tiny-learn-a"]
    assert cfg.counts() == [("8/0", 4, 0), ("auto", 0, 4)]
    with pytest.raises(ValueError, match="model"):
        preset("cpu-learn", model=" , ")


def test_gpu_learn_builds_its_own_model_on_the_papers_tasks():
    cfg = preset("gpu-learn")
    assert (cfg.model, cfg.catalogue, cfg.nodes, cfg.questions, cfg.generations) == ("small", "sapo", 8, 8, 8)
    assert 0 < cfg.time_limit < 600  # each invocation ends within 10 minutes; --resume goes on


def test_cpu_real_is_the_packaged_real_model_silo_first_then_four_four():
    cfg = preset("cpu-real")
    assert (cfg.model, cfg.catalogue, cfg.nodes, len(cfg.seeds)) == ("smollm2-135m", "easy", 4, 3)
    assert cfg.counts() == [("8/0", 4, 0), ("4/4", 2, 2)]


def test_option_suffixes_set_the_corrected_and_gated_node_options():
    assert node_options("4/4+tis") == {
        "ratio": "fixed",
        "external_baseline": "group",
        "correction": "token",
        "offpolicy_filter": 0.5,
    }
    assert node_options("4/4+gate+own") == {"ratio": "fixed", "external_baseline": "own", "success_gate": True}
    with pytest.raises(ValueError, match="unknown option"):
        preset("smoke", configs=["8/0", "4/4+typo"])


def test_cpu_real_hard_is_three_configurations_after_a_pilot_on_seeds_it_does_not_count():
    cfg = preset("cpu-real-hard")
    assert (cfg.model, cfg.catalogue, cfg.nodes, cfg.seeds, cfg.heldout) == (
        "smollm2-135m",
        "sapo",
        4,
        [1, 2, 3, 4, 5, 6],
        100,
    )
    assert cfg.counts() == [("8/0", 4, 0), ("4/4", 2, 2)]  # the pilot's place has no counts yet
    assert cfg.pilot_counts() == [("4/4+tis", 2, 2), ("4/4+gate", 2, 2)]
    chosen = cfg.with_choice("4/4+gate")
    assert chosen.configs == ["8/0", "4/4", "4/4+gate"] and not chosen.pilot_seeds
    assert [spec.dataset for spec in cfg.task_catalogue().tasks] == [
        "basic_arithmetic",
        "calendar_arithmetic",
        "decimal_arithmetic",
        "fraction_simplification",
    ]
    with pytest.raises(ValueError, match="not counted"):
        preset("cpu-real-hard", seeds=[1, 101])
    with pytest.raises(ValueError, match="held-out"):
        preset("cpu-real-hard", heldout=0)
    with pytest.raises(ValueError, match="a pilot needs"):
        preset("cpu-real-hard", configs=["8/0", "4/4"])
    with pytest.raises(ValueError, match="not in catalogue"):
        preset("cpu-real-hard", datasets=["arc_1d", "leap_years"])


def test_a_stream_limited_to_datasets_draws_only_those_and_the_whole_catalogue_as_before():
    limited = StratifiedTaskStream(SAPO_CATALOGUE, 5, ["basic_arithmetic", "decimal_arithmetic"])
    assert {r.dataset for r in limited.draw(6)} == {"basic_arithmetic", "decimal_arithmetic"}
    every = [spec.dataset for spec in SAPO_CATALOGUE.tasks]
    assert StratifiedTaskStream(SAPO_CATALOGUE, 5, every).draw(8) == StratifiedTaskStream(SAPO_CATALOGUE, 5).draw(8)


def test_a_study_node_takes_no_live_held_out_check(tmp_path):
    """A study measures held-out accuracy itself: its nodes do not announce the site's live check, so no
    greedy answers run between their rounds."""
    config = node_config(preset("cpu-real-hard"), "ws://x", "t", "smollm2-135m", tmp_path, 1, 0, "4/4", 2, 2)
    assert config.no_heldout_check


def test_cpu_real_hard_is_what_its_pre_registration_says():
    """docs/experiment.md's pre-registered settings of cpu-real-hard, field by field."""
    cfg = preset("cpu-real-hard")
    assert (cfg.model, cfg.catalogue, cfg.nodes, cfg.rounds, cfg.questions, cfg.generations) == (
        "smollm2-135m",
        "sapo",
        4,
        30,
        4,
        4,
    )
    assert (cfg.max_new_tokens, cfg.micro_batch, cfg.threads, cfg.heldout) == (32, 8, 1, 100)
    assert cfg.datasets == ["basic_arithmetic", "calendar_arithmetic", "fraction_simplification", "decimal_arithmetic"]
    assert (cfg.seeds, cfg.pilot_seeds, cfg.pilot_configs) == ([1, 2, 3, 4, 5, 6], [101, 102], ["4/4+tis", "4/4+gate"])
