"""The node client's wheel, as a contributor installs it: built from node_client/ the way the site
builds it (web.wheel). It holds the node and nothing of the research harness (research/, which starts
the platform from the repository checkout and so stays there), and its `sapo-node` runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

NODE_CLIENT = Path(__file__).resolve().parents[2] / "node_client"


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, a folder it is installed into) built from a copy of node_client/."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "node_client"
    shutil.copytree(NODE_CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    out = tmp / "out"
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", out, source], check=True, timeout=300)
    (wheel,) = out.glob("sapo_node-*.whl")
    target = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", target, wheel], check=True, timeout=300)
    return wheel, target


#: The wheel's copy alone, as in a contributor's environment: this environment's editable install of
#: the checkout puts a finder on sys.meta_path that would answer `sapo_node` modules from the checkout
#: when the wheel's copy has none.
_WHEEL_ONLY = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
import sapo_node
from sapo_node.cli import main
print(sapo_node.__file__)
sys.exit(main(sys.argv[1:]))
"""


def _run_cli(target: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(target)}
    return subprocess.run(
        [sys.executable, "-c", _WHEEL_ONLY, *args], env=env, cwd=target, capture_output=True, text=True, timeout=60
    )


def test_the_wheel_ships_the_node_and_not_the_research_harness(installed_wheel):
    wheel, _ = installed_wheel
    names = zipfile.ZipFile(wheel).namelist()
    assert "sapo_node/cli.py" in names and "sapo_node/loop.py" in names and "sapo_node/protocol.py" in names
    assert "sapo_node/transport/websocket.py" in names and "sapo_node/verifiers/__init__.py" in names
    assert "sapo_node/export.py" in names and "sapo_node/service.py" in names
    assert not [n for n in names if not n.startswith(("sapo_node/", "sapo_node-"))]  # no research/, no tests
    assert not [n for n in names if n.startswith("sapo_node/experiment")]


def test_the_wheels_cli_runs_with_its_commands(installed_wheel):
    _, target = installed_wheel
    result = _run_cli(target, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(str(target)), result.stdout  # the wheel's copy answered
    assert "run" in result.stdout and "export" in result.stdout and "service" in result.stdout
    assert "experiment" not in result.stdout
