"""The `sapo-node run` command end to end, offline, on a throwaway tiny model."""

from __future__ import annotations

import json
import os
import signal

import pytest
from node_toys import make_policy

from sapo_node import loop
from sapo_node.checkpoint import list_checkpoints
from sapo_node.cli import build_parser, main
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
    assert "questions" in capsys.readouterr().out  # the full config is printed at start


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


def test_an_online_run_shares_reports_and_flushes(tmp_path, monkeypatch):
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
