"""The defaults a node takes from its machine (sapo_node.machine): threads, the round's size, the
refusal of a model that cannot fit, the one line that says it all. The machine is a value here, so a
laptop and a GPU server are described, not needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sapo_node import machine as machine_module
from sapo_node.config import NodeConfig
from sapo_node.machine import (
    GIB,
    MODEL_SHAPES,
    Machine,
    MachineTooSmall,
    choose_threads,
    model_shape,
    peak_bytes,
    read_machine,
    usable_cores,
)

#: A 2-core laptop in use by other work, with 6 GiB to spare.
LAPTOP = Machine(cores=2, load=3.1, free_memory=6 * GIB)
#: An idle 16-core workstation with 64 GiB free.
WORKSTATION = Machine(cores=16, load=0.4, free_memory=64 * GIB)
#: A GPU server: 80 GB free on the device.
GPU = Machine(cores=32, load=1.0, free_memory=200 * GIB, device="cuda", device_memory=80 * GIB)


def fit(model: str, machine: Machine, **given):
    return NodeConfig(model=model, offline=True, **given).fit_to(machine)


def test_threads_are_the_idle_cores_never_all_of_a_busy_machine():
    assert choose_threads(LAPTOP, environ={}) == 1
    assert choose_threads(Machine(cores=2, load=0.1, free_memory=GIB), environ={}) == 2
    assert choose_threads(WORKSTATION, environ={}) == 15
    assert choose_threads(Machine(cores=8, load=40.0, free_memory=GIB), environ={}) == 1
    assert choose_threads(LAPTOP, environ={"OMP_NUM_THREADS": "2"}) == 2  # the user's own setting stands


def test_a_laptop_gets_a_smaller_round_of_a_real_model_than_a_workstation_or_a_gpu(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    laptop, _ = fit("smollm2-135m", LAPTOP)
    workstation, _ = fit("smollm2-135m", WORKSTATION)
    gpu, _ = fit("smollm2-135m", GPU)
    size = lambda c: c.questions * c.generations * c.max_new_tokens  # noqa: E731
    assert size(laptop) < size(workstation) <= size(gpu)
    assert (gpu.questions, gpu.generations, gpu.max_new_tokens, gpu.micro_batch) == (8, 8, 256, 16)
    for config, machine in ((laptop, LAPTOP), (workstation, WORKSTATION), (gpu, GPU)):
        free = machine.device_memory or machine.free_memory
        shape = MODEL_SHAPES["smollm2-135m"]
        peak = peak_bytes(
            shape, config.questions, config.generations, config.max_new_tokens, config.micro_batch, machine.device
        )
        assert peak < free, (config, machine)
        assert config.generations >= 2 and config.micro_batch <= config.questions * config.generations


def test_tiny_models_keep_their_round_and_a_little_memory_shrinks_the_micro_batch():
    config, _ = fit("tiny-mini", LAPTOP)
    assert (config.questions, config.generations, config.max_new_tokens, config.micro_batch) == (8, 8, 48, 16)
    squeezed, _ = fit("smollm2-135m", Machine(cores=16, load=0.0, free_memory=4 * GIB))
    roomy, _ = fit("smollm2-135m", Machine(cores=16, load=0.0, free_memory=64 * GIB))
    assert squeezed.micro_batch < roomy.micro_batch


def test_a_model_too_large_for_the_machine_is_refused_naming_what_fits():
    with pytest.raises(MachineTooSmall) as refused:
        fit("Qwen/Qwen2.5-0.5B-Instruct", Machine(cores=4, load=0.0, free_memory=3 * GIB))
    message = str(refused.value)
    assert "Qwen/Qwen2.5-0.5B-Instruct" in message and "3.0 GiB free" in message
    assert "models that fit: tiny-mini, tiny, small" in message and "--model" in message
    with pytest.raises(MachineTooSmall, match="no model fits"):
        fit("tiny-mini", Machine(cores=1, load=0.0, free_memory=GIB // 2))


def test_values_given_win_over_the_machine(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    given = {"threads": 2, "questions": 3, "generations": 5, "max_new_tokens": 17, "micro_batch": 7}
    config, line = fit("smollm2-135m", LAPTOP, **given)
    assert {k: getattr(config, k) for k in given} == given
    assert "threads 2 " in line and "B 3, G 5, 17 new tokens, micro-batch 7" in line
    # threads 0 is torch's default (all cores), asked for: kept
    assert fit("tiny-mini", LAPTOP, threads=0)[0].threads == 0


def test_the_one_line_names_every_choice_and_the_machine_behind_it(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config, line = fit("tiny-mini", LAPTOP)
    assert "\n" not in line and line.startswith("config: model tiny-mini on cpu, threads 1 (2 cores, load 3.1)")
    assert "B 8, G 8, 48 new tokens, micro-batch 16" in line and "free 6.0 GiB" in line
    assert "override with --threads/--questions/--generations/--max-new-tokens/--micro-batch" in line


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)],
)
def test_a_containers_cpu_quota_is_read_in_whole_cores_rounded_up(tmp_path, cpu_max, cores):
    path = tmp_path / "cpu.max"
    path.write_text(cpu_max)
    assert machine_module._cgroup_cores(path) == cores


def test_the_cores_a_process_may_use_are_its_affinity_bounded_by_its_quota(monkeypatch):
    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(machine_module, "_cgroup_cores", lambda: None)
    assert usable_cores() == affinity == read_machine("cpu").cores
    monkeypatch.setattr(machine_module, "_cgroup_cores", lambda: 1)
    assert usable_cores() == 1 == read_machine("cpu").cores


def test_an_unknown_model_is_sized_from_its_config_on_disk(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 2,
                "intermediate_size": 128,
                "vocab_size": 500,
                "tie_word_embeddings": True,
            }
        )
    )
    shape, known = model_shape(str(tmp_path))
    assert known and (shape.layers, shape.kv_dim, shape.vocab) == (2, 32, 500)
    assert model_shape(str(tmp_path / "nowhere"))[1] is False


def test_the_table_matches_the_built_models():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sapo_node.tiny.variants import VARIANTS

    for name in ("tiny-mini", "tiny", "small", "tiny-learn"):
        v = VARIANTS[name]
        with __import__("torch").device("meta"):
            model = Qwen2ForCausalLM(
                Qwen2Config(
                    vocab_size=v.vocab_size,
                    hidden_size=v.hidden_size,
                    num_hidden_layers=v.num_layers,
                    num_attention_heads=v.num_heads,
                    num_key_value_heads=v.num_kv_heads,
                    intermediate_size=v.intermediate_size,
                    tie_word_embeddings=True,
                )
            )
        assert MODEL_SHAPES[name].params == sum(p.numel() for p in model.parameters()), name


def test_this_machine_is_read_without_importing_torch():
    code = (
        "import sys\n"
        "from sapo_node.machine import read_machine\n"
        "m = read_machine('cpu')\n"
        "assert m.cores >= 1 and m.free_memory > 0 and m.load >= 0, m\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch not loaded"
    assert read_machine("cpu").device == "cpu"


def test_the_torch_and_transformers_the_tests_run_on_are_in_the_clients_declared_range():
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[2] / "node_client" / "pyproject.toml"
    declared = {
        (req := Requirement(line)).name: req.specifier
        for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    }
    for name in ("torch", "transformers"):
        installed = version(name)
        assert declared[name].contains(installed, prereleases=True), (name, installed, str(declared[name]))
        assert "<" in str(declared[name]), f"{name}: an open range lets pip pick a release nobody tested"


def test_a_round_given_beyond_the_memory_is_kept_and_the_line_warns(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    given = {"questions": 8, "generations": 8, "max_new_tokens": 256, "micro_batch": 16}
    config, line = fit("smollm2-135m", LAPTOP, **given)
    assert {k: getattr(config, k) for k in given} == given
    assert "WARNING: estimated peak" in line and "is over the 4.8 GiB this machine can give" in line


def test_a_micro_batch_given_too_large_is_warned_about_not_a_refusal_of_the_model(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config, line = fit("smollm2-135m", LAPTOP, micro_batch=256, max_new_tokens=256)
    assert config.micro_batch == 256 and "WARNING: estimated peak" in line
