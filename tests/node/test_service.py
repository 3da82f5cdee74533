"""`sapo-node service`: the user service's unit (systemd) or agent (launchd), and its token file."""

from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys

import pytest

from sapo_node import cli
from sapo_node.service import token_from_file, unit_path

TOKEN = "sapo_tok_3f9a-secret"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "SAPO_TOKEN", "SAPO_TOKEN_FILE", "SAPO_SERVER"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _unit_lines(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_the_unit_runs_the_node_niced_capped_and_restarted_and_never_names_the_token(home, capsys, monkeypatch):
    flags = ["--server", "https://sapo.example.org", "--swarm", "main", "--model", "tiny-mini", "--cpu-quota", "150"]
    assert cli.main(["service", "install", "--no-start", "--token", TOKEN, "--nice", "12", *flags]) == 0
    path = home / ".config" / "systemd" / "user" / "sapo-node.service"
    token_file = home / ".config" / "sapo-node" / "token"
    assert unit_path("Linux") == path
    unit = path.read_text()
    assert TOKEN not in unit and TOKEN not in capsys.readouterr().out
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and token_file.read_text().strip() == TOKEN
    fields = _unit_lines(unit)
    assert fields["Nice"] == ["12"] and fields["CPUQuota"] == ["150%"]
    assert fields["Restart"] == ["on-failure"] and fields["RestartPreventExitStatus"] == ["2"]
    assert fields["SuccessExitStatus"] == ["130"] and fields["WantedBy"] == ["default.target"]
    assert f"SAPO_TOKEN_FILE={token_file}" in fields["Environment"]
    # ExecStart is `sapo-node run` with the flags given, resumed in the data folder, one thread a core of quota
    argv = fields["ExecStart"][0].split()
    assert argv[:4] == [sys.executable, "-m", "sapo_node", "run"]
    args = cli.build_parser().parse_args(argv[3:])
    monkeypatch.setenv("SAPO_TOKEN_FILE", str(token_file))
    config = cli.config_from_args(args)
    assert (config.server, config.swarm, config.model, config.token) == (
        "https://sapo.example.org",
        "main",
        "tiny-mini",
        TOKEN,
    )
    assert config.resume and config.threads == 1 and config.out == str(home / ".local" / "share" / "sapo-node" / "run")
    if shutil.which("systemd-analyze"):  # systemd's own check of the unit: no complaint at all
        runtime = home / "runtime"
        runtime.mkdir(mode=0o700)
        checked = subprocess.run(
            ["systemd-analyze", "--user", "verify", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
        )
        assert (checked.returncode, checked.stdout + checked.stderr) == (0, ""), checked.stderr

    assert cli.main(["service", "uninstall", "--no-start"]) == 0
    assert not path.exists() and not token_file.exists()


def test_macos_gets_a_launchd_agent_with_the_same_command_and_no_token(home, capsys):
    args = ["service", "print", "--platform", "macos", "--server", "https://sapo.example.org", "--model", "tiny"]
    assert cli.main(args) == 0
    agent = plistlib.loads(capsys.readouterr().out.encode())
    assert agent["ProgramArguments"][3:6] == ["run", "--server", "https://sapo.example.org"]
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["Nice"] == 10
    assert agent["EnvironmentVariables"]["SAPO_TOKEN_FILE"] == str(home / ".config" / "sapo-node" / "token")
    assert unit_path("Darwin") == home / "Library" / "LaunchAgents" / "org.sapo-swarm.node.plist"


def test_a_token_file_others_may_read_is_refused_by_the_run(home, capsys, monkeypatch):
    token_file = home / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    monkeypatch.setenv("SAPO_TOKEN_FILE", str(token_file))
    assert cli.main(["run", "--server", "ws://127.0.0.1:9", "--model", "tiny-mini"]) == 2
    assert "may be read by others (mode 644): chmod 600 it" in capsys.readouterr().err
    token_file.chmod(0o600)
    assert token_from_file(token_file) == TOKEN
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        token_from_file(token_file)
    with pytest.raises(ValueError, match="No such file"):
        token_from_file(home / "missing")


def test_install_refuses_without_a_token_and_bad_limits(home, capsys):
    assert cli.main(["service", "install", "--no-start", "--server", "https://sapo.example.org"]) == 2
    assert "no token" in capsys.readouterr().err
    assert not unit_path("Linux").exists()
    assert cli.main(["service", "print", "--nice", "25", "--server", "https://x"]) == 2
    assert cli.main(["service", "print", "--cpu-quota", "0", "--server", "https://x"]) == 2
    assert cli.main(["service", "print", "--model", "tiny"]) == 2  # no server, not offline
    assert "give --server URL" in capsys.readouterr().err
