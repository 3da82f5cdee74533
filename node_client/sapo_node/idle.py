"""The idle policy a contributor sets once (`--pause-when-busy LOAD`, `--pause-on-battery`): a small
monitor thread holds the node's pause gate (sapo_node.pause) for the reason "busy" while the machine's
other work loads it, and for "battery" while it runs on battery; the loop waits on the gate.

Busy is the 1-minute load average less the node's own part of it. The kernel's figure is an
exponentially damped average (a 60 s time constant) of the runnable tasks, so the node's part is its
process' CPU use damped the same way, scaled by load / cores when the cores are over-committed (each
runnable task then gets that share of a core: a node whose threads outnumber the cores would otherwise
read its own queue as another's load and pause itself). The node pauses above LOAD and resumes below
RESUME_SHARE x LOAD, so a load near the bar does not flip it every check.

Battery: Linux reads /sys/class/power_supply (a system battery discharging, or every mains supply
offline); macOS asks `pmset -g batt`; elsewhere it is unknown and the option does nothing (said once).

Every reader is a parameter (a load function, a CPU-seconds function, a clock, the power_supply root),
so tests give real files and figures without touching the product's logic (tests/node/test_idle_policy.py).
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sapo_node.pause import PauseGate

BUSY = "busy"
BATTERY = "battery"
#: Seconds between checks: the kernel samples the load every 5 s.
CHECK_SECONDS = 5.0
#: The load average's time constant (its 1-minute figure).
LOAD_WINDOW = 60.0
#: A busy pause ends once the other work's load falls below this share of --pause-when-busy.
RESUME_SHARE = 0.75
POWER_SUPPLY = Path("/sys/class/power_supply")


def load_average() -> float:
    return os.getloadavg()[0]


def process_cpu_seconds() -> float:
    """User and system CPU seconds of this process, all its threads."""
    t = os.times()
    return t.user + t.system


def process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), None where unknown."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks after boot
        return max(0.0, float(Path("/proc/uptime").read_text().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def on_battery_linux(root: Path = POWER_SUPPLY) -> bool | None:
    """True on battery, False on mains, None when `root` says nothing (a desktop, a container).
    A battery of scope Device (a wireless mouse's) is not the machine's; USB supplies are left out."""
    batteries, mains = [], []
    try:
        supplies = sorted(root.iterdir())
    except OSError:
        return None
    for supply in supplies:
        kind = _read(supply / "type")
        if kind == "Battery" and _read(supply / "scope") != "Device":
            batteries.append(_read(supply / "status"))
        elif kind == "Mains":
            mains.append(_read(supply / "online"))
    if "Discharging" in batteries:
        return True
    if mains and batteries and all(online == "0" for online in mains):
        return True
    return False if batteries or mains else None


def pmset_on_battery(text: str) -> bool | None:
    """macOS `pmset -g batt`'s first line: "Now drawing from 'Battery Power'" or "'AC Power'"."""
    first = text.splitlines()[0] if text else ""
    if "Battery Power" in first:
        return True
    if "AC Power" in first:
        return False
    return None


def on_battery() -> bool | None:
    """This machine's power source; None where it cannot be read (not Linux or macOS)."""
    system = platform.system()
    if system == "Linux":
        return on_battery_linux()
    if system == "Darwin":
        try:
            done = subprocess.run(["pmset", "-g", "batt"], capture_output=True, text=True, timeout=5, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return pmset_on_battery(done.stdout)
    return None


class IdleMonitor:
    """Holds `gate` for BUSY and BATTERY as the policy says; `check()` is one look, `start()` a thread
    that looks every `interval` seconds until `stop()`."""

    def __init__(
        self,
        gate: PauseGate,
        *,
        busy_load: float | None = None,
        battery: bool = False,
        cores: int = 1,
        read_load: Callable[[], float] = load_average,
        read_cpu: Callable[[], float] = process_cpu_seconds,
        read_battery: Callable[[], bool | None] = on_battery,
        clock: Callable[[], float] = time.monotonic,
        age: float | None = None,
        interval: float = CHECK_SECONDS,
    ) -> None:
        if busy_load is not None and not busy_load > 0:
            raise ValueError(f"--pause-when-busy must be a load above 0, not {busy_load}")
        self.gate, self.busy_load, self.battery, self.cores = gate, busy_load, battery, max(1, cores)
        self._read_load, self._read_cpu, self._read_battery, self._clock = read_load, read_cpu, read_battery, clock
        self.interval = interval
        # The process' CPU so far, as the damped average would hold it had it been spread over its life.
        cpu, now = read_cpu(), clock()
        life = age if age is not None else (process_age() or LOAD_WINDOW)
        self.own_cpu = cpu / life * (1 - math.exp(-life / LOAD_WINDOW)) if life > 0 else 0.0
        self._last = (now, cpu)
        #: The last figures read (None before the first check, or when the load is unreadable).
        self.other_load: float | None = None
        self.battery_known: bool | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        now, cpu = self._clock(), self._read_cpu()
        dt = now - self._last[0]
        if dt > 0:
            decay = math.exp(-dt / LOAD_WINDOW)
            rate = max(0.0, cpu - self._last[1]) / dt
            self.own_cpu = self.own_cpu * decay + rate * (1 - decay)
            self._last = (now, cpu)
        if self.busy_load is not None:
            self._check_busy()
        if self.battery:
            self._check_battery()

    def _check_busy(self) -> None:
        try:
            load = self._read_load()
        except (OSError, AttributeError):  # no load average here (Windows): never busy
            self.other_load = None
            self.gate.resume(BUSY)
            return
        own = self.own_cpu * max(1.0, load / self.cores)
        self.other_load = other = max(0.0, load - own)
        assert self.busy_load is not None
        if other > self.busy_load:
            self.gate.pause(BUSY, f"load {other:.1f} besides this node, above {self.busy_load:g}")
        elif other < self.busy_load * RESUME_SHARE:
            self.gate.resume(BUSY)

    def _check_battery(self) -> None:
        self.battery_known = state = self._read_battery()
        if state:
            self.gate.pause(BATTERY)
        else:
            self.gate.resume(BATTERY)

    def start(self) -> IdleMonitor:
        self.check()
        if self.battery and self.battery_known is None:
            print("--pause-on-battery: this machine does not say whether it runs on battery: never paused for it")
        self._thread = threading.Thread(target=self._run, name="sapo-idle", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def start_idle_policy(gate: PauseGate, *, busy_load: float | None, battery: bool) -> IdleMonitor | None:
    """The monitor of a run's idle policy, started; None when the run has none."""
    if busy_load is None and not battery:
        return None
    return IdleMonitor(gate, busy_load=busy_load, battery=battery, cores=available_cores()).start()
