"""The idle policy (sapo_node.idle): the monitor holds the pause gate for "busy" and "battery" from the
load average less the node's own CPU, and from a power_supply tree (here a real one in tmp_path)."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from node_toys import make_policy

from sapo_node import loop
from sapo_node.cli import build_parser, config_from_args, main
from sapo_node.config import NodeConfig
from sapo_node.idle import (
    BATTERY,
    BUSY,
    IdleMonitor,
    on_battery_linux,
    pmset_on_battery,
    process_age,
    process_cpu_seconds,
)
from sapo_node.pause import PauseGate
from sapo_node.transport import SiloTransport


class Figures:
    """What a monitor reads, moved by hand: a clock, this process' CPU seconds, and a load average
    damped as the kernel's is (every 5 s, a 60 s time constant) from the runnable tasks."""

    def __init__(self) -> None:
        self.now, self.load, self.cpu = 1000.0, 0.0, 0.0

    def run(self, monitor: IdleMonitor, seconds: float, *, runnable: float, own_cpu: float) -> None:
        """`seconds` of a steady machine: `runnable` tasks in all, the node using `own_cpu` cores."""
        decay = math.exp(-5.0 / 60.0)
        for _ in range(int(seconds / 5.0)):
            self.now += 5.0
            self.cpu += own_cpu * 5.0
            self.load = self.load * decay + runnable * (1 - decay)
            monitor.check()

    def monitor(self, gate: PauseGate, **policy) -> IdleMonitor:
        return IdleMonitor(
            gate, read_load=lambda: self.load, read_cpu=lambda: self.cpu, clock=lambda: self.now, age=0.0, **policy
        )


def test_busy_pauses_above_the_bar_and_resumes_only_below_three_quarters_of_it():
    gate, figures = PauseGate(), Figures()
    monitor = figures.monitor(gate, busy_load=2.0, cores=4)
    figures.run(monitor, 300, runnable=1.9, own_cpu=0.0)
    assert not gate.paused
    figures.run(monitor, 300, runnable=2.5, own_cpu=0.0)
    assert gate.reasons == {BUSY} and gate.details[BUSY].endswith("besides this node, above 2")
    figures.run(monitor, 300, runnable=1.6, own_cpu=0.0)  # below the bar, above 1.5: still busy
    assert gate.reasons == {BUSY}
    figures.run(monitor, 300, runnable=1.4, own_cpu=0.0)
    assert not gate.paused and monitor.other_load == pytest.approx(1.4, abs=0.02)


def test_the_nodes_own_cpu_is_not_counted_as_the_machines_load():
    gate, figures = PauseGate(), Figures()
    monitor = figures.monitor(gate, busy_load=0.8, cores=2)
    # Its two threads and 0.3 of other work on two cores: it gets 2 x 2 / 2.3 of them, and trains on.
    figures.run(monitor, 300, runnable=2.3, own_cpu=2 * 2 / 2.3)
    assert not gate.paused and monitor.other_load == pytest.approx(0.3, abs=0.02)
    # Alone, three runnable threads on two cores: a load of 3 is still all its own.
    figures.run(monitor, 300, runnable=3.0, own_cpu=2.0)
    assert not gate.paused and monitor.other_load == pytest.approx(0.0, abs=0.03)
    # Another program with 1.5 runnable threads joins: the node's share of the cores falls to 3 / 4.5.
    figures.run(monitor, 300, runnable=4.5, own_cpu=2.0 * 3 / 4.5)
    assert gate.reasons == {BUSY} and monitor.other_load == pytest.approx(1.5, abs=0.03)


def test_the_cpu_the_process_used_before_the_monitor_started_counts_as_its_own():
    # A node that loaded its model at one core for 40 s before the monitor: the load average still holds it.
    gate = PauseGate()
    monitor = IdleMonitor(
        gate,
        busy_load=0.5,
        cores=2,
        read_load=lambda: (1 - math.exp(-40 / 60)) + 0.1,  # one core damped over 40 s, and 0.1 of others
        read_cpu=lambda: 40.0,
        clock=lambda: 1000.0,
        age=40.0,
    )
    monitor.check()
    assert not gate.paused and monitor.other_load == pytest.approx(0.1, abs=0.01)


def test_the_real_readers_see_this_process_work():
    before = process_cpu_seconds()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    assert process_cpu_seconds() - before >= 0.25
    age = process_age()
    assert age is None or 0 < age < 30 * 24 * 3600


def supply(root: Path, name: str, **files: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in files.items():
        (folder / key).write_text(value + "\n")
    return folder


def test_battery_discharging_pauses_and_mains_resumes(tmp_path):
    root = tmp_path / "power_supply"
    supply(root, "BAT0", type="Battery", scope="System", status="Discharging")
    supply(root, "AC", type="Mains", online="0")
    supply(root, "hidpp_battery_0", type="Battery", scope="Device", status="Discharging")  # a mouse's
    gate = PauseGate()
    monitor = IdleMonitor(gate, battery=True, read_battery=lambda: on_battery_linux(root))
    monitor.check()
    assert gate.reasons == {BATTERY}
    supply(root, "BAT0", status="Charging")
    supply(root, "AC", online="1")
    monitor.check()
    assert not gate.paused
    # The mains alone may say it: offline with a battery present (whose status some drivers leave Unknown).
    supply(root, "BAT0", status="Unknown")
    supply(root, "AC", online="0")
    monitor.check()
    assert gate.reasons == {BATTERY}


def test_what_counts_as_on_battery(tmp_path):
    root = tmp_path / "ps"
    assert on_battery_linux(root) is None  # no tree: a container
    root.mkdir()
    assert on_battery_linux(root) is None  # a desktop with no supply
    supply(root, "hidpp_battery_0", type="Battery", scope="Device", status="Discharging")
    supply(root, "usb", type="USB", online="0")
    assert on_battery_linux(root) is None  # a mouse's battery and an unplugged USB port say nothing
    supply(root, "AC", type="Mains", online="1")
    assert on_battery_linux(root) is False
    supply(root, "BAT1", type="Battery", status="Full")
    assert on_battery_linux(root) is False
    # macOS's pmset -g batt, as it prints
    assert pmset_on_battery("Now drawing from 'Battery Power'\n -InternalBattery-0 (id=1) 85%; discharging;")
    assert pmset_on_battery("Now drawing from 'AC Power'\n -InternalBattery-0 (id=1) 100%; charged;") is False
    assert pmset_on_battery("") is None


def test_an_unknown_power_source_never_pauses_and_says_so_once(capsys):
    gate = PauseGate()
    monitor = IdleMonitor(gate, battery=True, read_battery=lambda: None, interval=0.05).start()
    try:
        time.sleep(0.2)
        assert not gate.paused
    finally:
        monitor.stop()
    out = capsys.readouterr().out
    assert out.count("does not say whether it runs on battery") == 1


def test_the_monitor_thread_follows_the_files_and_the_gate_waits_for_both_reasons(tmp_path, capsys):
    root = tmp_path / "power_supply"
    supply(root, "BAT0", type="Battery", status="Discharging")
    load = [3.0]
    gate = PauseGate()
    monitor = IdleMonitor(
        gate,
        busy_load=2.0,
        battery=True,
        cores=2,
        read_load=lambda: load[0],
        read_cpu=lambda: 0.0,
        read_battery=lambda: on_battery_linux(root),
        age=0.0,
        interval=0.05,
    ).start()
    node = SimpleNamespace(transport=SiloTransport(), gate=gate)
    waited = threading.Thread(target=loop.wait_while_paused, args=(node, None))
    try:
        assert gate.reasons == {BUSY, BATTERY}
        waited.start()
        out, deadline = "", time.monotonic() + 10
        while "on battery" not in out and time.monotonic() < deadline:
            time.sleep(0.02)
            out += capsys.readouterr().out
        supply(root, "BAT0", status="Charging")  # on mains again: still busy
        deadline = time.monotonic() + 10
        while gate.reasons != {BUSY} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gate.reasons == {BUSY}
        time.sleep(0.2)
        assert waited.is_alive()  # one reason left: the loop still waits
        load[0] = 1.0
        waited.join(10)
        assert not waited.is_alive() and not gate.paused
    finally:
        monitor.stop()
    lines = (out + capsys.readouterr().out).splitlines()
    assert lines == [
        "paused while on battery (--pause-on-battery); "
        "paused while the machine is busy (--pause-when-busy): load 3.0 besides this node, above 2",
        "paused while the machine is busy (--pause-when-busy): load 3.0 besides this node, above 2",
        "resumed",
    ]


def test_the_options_parse_show_in_help_and_are_the_commands_not_the_runs(tmp_path, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "--pause-when-busy LOAD" in help_text and "--pause-on-battery" in help_text
    args = build_parser().parse_args(["run", "--offline", "--pause-when-busy", "1.5", "--pause-on-battery"])
    config = config_from_args(args)
    assert (config.pause_when_busy, config.pause_on_battery) == (1.5, True)
    assert main(["run", "--offline", "--pause-when-busy", "0"]) == 2
    assert "pause_when_busy must be > 0" in capsys.readouterr().err

    # A run with the policy starts its monitor and stops it at the end; its resume forgets the policy.
    monkeypatch.setattr(loop, "load_model", lambda config: make_policy("a", seed=0))
    out = tmp_path / "run"
    small = ["--questions", "2", "--generations", "2", "--max-new-tokens", "6", "--local", "2", "--seed", "5"]
    assert main(["run", "--offline", "--rounds", "1", "--out", str(out), "--pause-when-busy", "1000", *small]) == 0
    assert not [t for t in threading.enumerate() if t.name == "sapo-idle"]
    resumed = config_from_args(build_parser().parse_args(["run", "--resume", "--out", str(out)]))
    assert resumed.pause_when_busy is None and not resumed.pause_on_battery
    assert NodeConfig.from_json({"pause_when_busy": 2.0}).pause_when_busy == 2.0


def test_the_service_passes_the_policy_to_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    flags = ["--server", "https://sapo.example.org", "--pause-when-busy", "1.5", "--pause-on-battery"]
    assert main(["service", "print", *flags]) == 0
    exec_start = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("ExecStart="))
    argv = exec_start.removeprefix("ExecStart=").split()
    config = config_from_args(build_parser().parse_args(argv[3:]))
    assert (config.pause_when_busy, config.pause_on_battery) == (1.5, True)
