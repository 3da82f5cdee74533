"""The `sapo-node run` command end to end, offline, on a throwaway tiny model."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
from node_toys import make_policy

from sapo_node import loop
from sapo_node.checkpoint import list_checkpoints
from sapo_node.cli import build_parser, config_from_args, main
from sapo_node.config import NodeConfig, field_docs

SMALL = ["--questions", "2", "--generations", "2", "--max-new-tokens", "6", "--local", "2", "--seed", "5"]


@pytest.fixture(autouse=True)
def toy_model(monkeypatch):
    monkeypatch.setattr(loop, "load_model", lambda config: make_policy("a", seed=0))


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_every_config_field_has_a_docstring_and_a_flag(capsys):
    import dataclasses

    names = [f.name for f in dataclasses.fields(NodeConfig)]
    assert set(field_docs()) == set(names)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    for name in names:
        assert "--" + name.replace("_", "-") in help_text


def test_offline_run_writes_config_metrics_and_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--offline", "--rounds", "2", "--out", str(out), *SMALL]) == 0
    config = json.loads((out / "config.json").read_text())
    assert (
        config["questions"] == 2 and config["catalogue"] == "easy" and config["seed"] == 5 and config["token"] is None
    )
    rows = _metrics(out)
    assert [r["round"] for r in rows] == [1, 2]
    for key in (
        "reward_mean",
        "reward_std",
        "zero_advantage_share",
        "clip_fraction",
        "loss",
        "tokens_per_s",
        "local_offered",
        "local_kept",
        "external_offered",
        "external_kept",
        "accepted",
        "rejected",
    ):
        assert key in rows[0]
    assert set(rows[0]["seconds"]) >= {"generate", "score", "share", "assemble", "update"}
    assert rows[0]["local_offered"] == 2 and rows[0]["connection"] == "silo"
    assert [p.name for p in list_checkpoints(out)] == ["round-000002"]
    # The start says its choices in one line and where every setting is, not the config a field a line.
    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("config: model ") for line in printed) == 1
    assert f"every setting in {out / 'config.json'}" in printed[1]
    assert not any(line.lstrip().startswith("questions ") for line in printed)


def test_resume_continues_the_round_count(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--offline", "--rounds", "1", "--out", str(out), *SMALL]) == 0
    assert main(["run", "--resume", "--offline", "--rounds", "3", "--out", str(out)]) == 0
    assert [r["round"] for r in _metrics(out)] == [1, 2, 3]
    assert json.loads((out / "config.json").read_text())["questions"] == 2  # the saved config is the base


def test_ctrl_c_finishes_the_round_saves_and_exits_130(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_score = loop.score_rollouts

    def score_then_interrupt(n, questions, generated):
        if n == 2:
            os.kill(os.getpid(), signal.SIGINT)  # as if the user pressed Ctrl-C during round 2
        return real_score(n, questions, generated)

    monkeypatch.setattr(loop, "score_rollouts", score_then_interrupt)
    before = signal.getsignal(signal.SIGINT)  # Python's own, or SIG_IGN under nohup and `cmd &`
    assert main(["run", "--offline", "--rounds", "5", "--out", str(out), "--checkpoint-every", "0", *SMALL]) == 130
    assert [r["round"] for r in _metrics(out)] == [1, 2]
    assert [p.name for p in list_checkpoints(out)] == ["round-000002"]
    assert signal.getsignal(signal.SIGINT) is before  # restored

    monkeypatch.setattr(loop, "score_rollouts", real_score)
    assert main(["run", "--resume", "--offline", "--rounds", "3", "--out", str(out)]) == 0
    assert [r["round"] for r in _metrics(out)] == [1, 2, 3]


def test_a_resumed_run_repeats_what_an_uninterrupted_one_does(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["run", "--offline", "--rounds", "2", "--out", str(straight), *SMALL]) == 0
    assert main(["run", "--offline", "--rounds", "1", "--out", str(split), *SMALL]) == 0
    assert main(["run", "--resume", "--offline", "--rounds", "2", "--out", str(split)]) == 0
    a, b = _metrics(straight)[1], _metrics(split)[1]
    assert (a["reward_mean"], a["generated_tokens"], a["loss"]) == (b["reward_mean"], b["generated_tokens"], b["loss"])


def test_online_without_a_server_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SAPO_SERVER", raising=False)
    assert main(["run", "--out", str(tmp_path)]) == 2
    assert "--server" in capsys.readouterr().err


def test_an_online_run_shares_reports_and_flushes(tmp_path, monkeypatch, capsys):
    from fake_pool import FakePool

    pool = FakePool().start()
    try:
        monkeypatch.setenv("SAPO_TOKEN", pool.token)
        out = tmp_path / "run"
        assert main(["run", "--server", pool.url, "--rounds", "2", "--out", str(out), *SMALL]) == 0
        assert len(pool.groups) == 4 and [r["round"] for r in pool.reports] == [1, 2]
        rows = _metrics(out)
        assert rows[-1]["connection"] == "connected"
        assert pool.token not in (out / "config.json").read_text()  # the token is never saved
        assert "; shares: 4 accepted, 0 pending; " in capsys.readouterr().out.splitlines()[-1]
    finally:
        pool.stop()


def test_with_the_server_down_the_node_trains_on_and_keeps_its_shares(tmp_path, monkeypatch):
    from fake_pool import free_port

    from sapo_node.outbox import Outbox

    monkeypatch.setenv("SAPO_TOKEN", "t")
    out = tmp_path / "run"
    url = f"ws://127.0.0.1:{free_port()}/ws/node/"
    argv = ["run", "--server", url, "--rounds", "2", "--out", str(out), "--connect-wait", "0.2", "--flush-wait", "0.2"]
    assert main([*argv, *SMALL]) == 0
    rows = _metrics(out)
    assert [r["round"] for r in rows] == [1, 2] and rows[-1]["connection"] in ("connecting", "retrying")
    assert Outbox(out / "outbox.sqlite3").counts()["pending"] == 4  # waiting for the next connection


def test_resuming_a_run_with_another_model_is_refused_with_a_clear_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model": "tiny", "offline": True}))

    code = main(["run", "--resume", "--out", str(tmp_path), "--model", "tiny-mini", "--offline"])

    assert code == 2
    err = capsys.readouterr().err
    assert "holds a run of model 'tiny'" in err and "--model tiny" in err


def test_threads_flag_sets_torch_threads_for_the_run(tmp_path):
    import torch

    before = torch.get_num_threads()
    try:
        assert (
            main(["run", "--offline", "--rounds", "1", "--out", str(tmp_path / "run"), "--threads", "1", *SMALL]) == 0
        )
        assert torch.get_num_threads() == 1
        assert json.loads((tmp_path / "run" / "config.json").read_text())["threads"] == 1
    finally:
        torch.set_num_threads(before)


def _interrupt_in_round(monkeypatch, n):
    real_score = loop.score_rollouts

    def score_then_interrupt(round_n, questions, generated):
        if round_n == n:
            os.kill(os.getpid(), signal.SIGINT)
        return real_score(round_n, questions, generated)

    monkeypatch.setattr(loop, "score_rollouts", score_then_interrupt)
    return real_score


def _printed_command(text, after):
    line = next(line for line in text.splitlines() if after in line)
    return shlex.split(line.split(after, 1)[1])


def test_the_resume_hint_of_an_offline_run_is_a_command_that_continues_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SAPO_SERVER", raising=False)
    out = tmp_path / "my run"
    real_score = _interrupt_in_round(monkeypatch, 1)
    assert main(["run", "--offline", "--rounds", "3", "--out", str(out), *SMALL]) == 130
    command = _printed_command(capsys.readouterr().out, "continue with: ")
    assert command[:2] == ["sapo-node", "run"] and "--server" not in command

    monkeypatch.setattr(loop, "score_rollouts", real_score)
    assert main(command[1:]) == 0
    assert [r["round"] for r in _metrics(out)] == [1, 2, 3]


def test_the_resume_hint_of_an_online_run_names_its_server_never_the_token(tmp_path, monkeypatch, capsys):
    from fake_pool import FakePool

    pool = FakePool().start()
    try:
        monkeypatch.setenv("SAPO_TOKEN", pool.token)
        monkeypatch.setenv("SAPO_SERVER", pool.url)  # the run's server comes from the environment
        out = tmp_path / "run"
        _interrupt_in_round(monkeypatch, 1)
        assert main(["run", "--rounds", "3", "--out", str(out), *SMALL]) == 130
    finally:
        pool.stop()
    text = capsys.readouterr().out
    command = _printed_command(text, "continue with: ")
    assert pool.token not in text
    assert command[command.index("--server") + 1] == pool.url

    # pasted into another shell, without the SAPO_SERVER this one had: the arguments are whole
    monkeypatch.delenv("SAPO_SERVER")
    args = build_parser().parse_args(command[1:])
    config = config_from_args(args).resolved()
    assert (config.server, config.offline, config.resume, config.out) == (pool.url, False, True, str(out))


def test_a_command_without_a_server_fails_before_torch_loads(tmp_path):
    code = (
        "import sys\n"
        "from sapo_node.cli import main\n"
        f"rc = main(['run', '--resume', '--out', {str(tmp_path)!r}])\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
        "sys.exit(rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SAPO_SERVER"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "--server" in done.stderr
    assert done.stdout.strip() == "torch not loaded"


def test_a_run_that_plays_its_last_round_says_so_and_how_to_export_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--offline", "--rounds", "2", "--out", str(out), *SMALL]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("done: 2 rounds (rounds 1-2) in ") and "shares" not in last
    export = shlex.split(last.split("the model: ", 1)[1])
    assert export[:4] == ["sapo-node", "export", "--run", str(out)]
    args = build_parser().parse_args(export[1:])
    assert args.run == out and args.out == tmp_path / "run-model"


def test_a_run_says_its_choices_in_one_line_and_the_flags_given_win(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out = tmp_path / "run"
    assert main(["run", "--offline", "--rounds", "1", "--out", str(out), "--micro-batch", "3", *SMALL]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("config: ")]
    assert len(lines) == 1 and "B 2, G 2, 6 new tokens, micro-batch 3" in lines[0]
    assert "cores, load " in lines[0] and "override with --threads" in lines[0]
    saved = json.loads((out / "config.json").read_text())
    assert (saved["questions"], saved["generations"], saved["max_new_tokens"], saved["micro_batch"]) == (2, 2, 6, 3)
    assert saved["threads"] >= 1  # chosen from the machine, never torch's all-cores default


def test_a_model_too_large_for_the_machine_is_refused_before_torch_loads(tmp_path):
    huge = tmp_path / "huge-model"  # a 405B-parameter model's config: no machine here has its memory
    huge.mkdir()
    huge_config = {"hidden_size": 16384, "num_attention_heads": 128, "num_key_value_heads": 8}
    huge_config |= {"num_hidden_layers": 126, "intermediate_size": 53248, "vocab_size": 128256}
    (huge / "config.json").write_text(json.dumps(huge_config))
    code = (
        "import sys\n"
        "from sapo_node.cli import main\n"
        f"rc = main(['run', '--offline', '--model', {str(huge)!r}, '--out', {str(tmp_path / 'run')!r}])\n"
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "needs about" in done.stderr and "models that fit: tiny-mini" in done.stderr
    assert done.stdout.strip() == "torch not loaded" and not (tmp_path / "run").exists()


def test_a_resumed_run_keeps_its_round_and_chooses_its_threads_again(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what the machine offers at resume time
    out, before = tmp_path / "run", torch.get_num_threads()
    try:
        assert main(["run", "--offline", "--rounds", "1", "--out", str(out), "--threads", "3", *SMALL]) == 0
        args = build_parser().parse_args(["run", "--resume", "--out", str(out), "--rounds", "2"])
        config = config_from_args(args)
        assert (config.questions, config.generations, config.max_new_tokens) == (2, 2, 6) and config.threads is None
        assert main(["run", "--resume", "--out", str(out), "--rounds", "2"]) == 0
    finally:
        torch.set_num_threads(before)
    saved = json.loads((out / "config.json").read_text())
    assert saved["threads"] == 1 and (saved["questions"], saved["micro_batch"]) == (2, 4)
