"""Work on a configuration nobody has reviewed, bounded: a catalogue staff save names reasoning-gym
keyword arguments, and some make it build for ever (a chain_sum of millions of terms) or take the
machine's memory. The work runs in a worker process from the sandbox's fork server
(verifiers.sandbox), with the sandbox's memory limit, and is killed once it has used its CPU time
(read by the parent from /proc, with the kernel's RLIMIT_CPU behind it), or after a looser wall clock
(a worker starved on a loaded machine, or stopped, still ends). CPU, not wall clock, is the bound: on a
loaded machine a build of a few CPU-seconds takes several times as long, and would be refused for the
machine's load rather than for its cost.

`build_first_bounded` builds a dataset's first entry (the catalogue check, and the server's one
measurement of what a dataset costs); `run_bounded` runs any such work (the server verifying a
share's groups of a dataset costly to build, pool.builds).
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sapo_node.datasets import TaskSpec
from sapo_node.tasks import build_first
from sapo_node.verifiers.sandbox import MEMORY_BYTES, resource, tell_parent, vm_bytes, worker_context

#: CPU seconds bounded work may use (the catalogue check's bound on one entry, and the server's on a
#: dataset it measures or builds for a share).
BUILD_CPU_SECONDS = 10.0
#: Wall-clock seconds after which bounded work is killed whatever CPU it used: three times its CPU
#: bound, so work that gets a third of a core meets its CPU bound first.
BUILD_WALL_SECONDS = 30.0
#: Wall-clock seconds a build worker may take to start (the fork server's first start imports
#: reasoning-gym: a second of CPU, more on a loaded machine); not counted in its build's time.
START_SECONDS = 60.0
#: The longest the parent waits between two reads of a running worker's CPU time. It reads more often
#: as the worker nears its bound: a worker of one thread uses no more CPU than the time waited.
POLL_SECONDS = 0.25


class BuildTimeout(Exception):
    """Bounded work ran out of time (`run_bounded`); `cpu_seconds`: what its worker used by then;
    `wall`: it ran out of wall clock (its CPU bound not reached)."""

    def __init__(self, message: str, cpu_seconds: float = 0.0, *, wall: bool = False) -> None:
        super().__init__(message)
        self.cpu_seconds = cpu_seconds
        self.wall = wall


class BuildFailed(RuntimeError):
    """Bounded work raised, or its worker died (out of memory); `cpu_seconds`: what the worker used."""

    def __init__(self, message: str, cpu_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.cpu_seconds = cpu_seconds


@dataclass(frozen=True)
class BuildCost:
    """What building a dataset and its first entry cost a worker: CPU seconds, and the most memory it
    held beyond its size at start (its peak resident set, Linux's VmHWM; 0 where that cannot be read).
    `worker_seconds`: the worker's CPU in all, its start included (what the machine paid)."""

    cpu_seconds: float
    peak_bytes: int
    worker_seconds: float = 0.0


@dataclass(frozen=True)
class Bounded:
    """What bounded work returned (`value`), its CPU seconds and peak memory beyond the worker's size
    at start (as BuildCost's), and the worker's CPU in all (`worker_seconds`, its start included)."""

    value: Any
    cpu_seconds: float
    peak_bytes: int
    worker_seconds: float


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _own_cpu() -> float:
    if resource is None:
        return time.process_time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int | None) -> float | None:
    """The CPU seconds process `pid` has used (Linux's /proc/<pid>/stat), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def _worker(conn: Connection, cpu_seconds: float, memory_bytes: int, work: Callable[..., Any], args: tuple) -> None:
    """A bounded worker: `work(*args)` under the memory limit and, should the parent not kill it in time,
    the kernel's CPU limit; sends ("started", its CPU seconds so far), then a Bounded, or what went
    wrong (a BuildFailed)."""
    if resource is not None:
        size = vm_bytes()
        if size is not None:
            resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, size + memory_bytes))
        # Whole seconds, a second past the parent's bound: the parent's kill comes first, with its reason.
        soft = math.ceil(_own_cpu() + cpu_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))
    # The bounds start here, not while the fork server imports reasoning-gym.
    if not tell_parent(conn, ("started", _own_cpu())):
        return
    try:  # the peak from here on: Linux resets VmHWM to the resident set on "5"
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    resident = _status_bytes("VmRSS")
    started = time.process_time()
    try:
        value = work(*args)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever reasoning-gym raised
        tell_parent(conn, BuildFailed(f"{exc}" or type(exc).__name__, _own_cpu()))
        return
    spent = time.process_time() - started
    peak = _status_bytes("VmHWM")
    grown = max(0, peak - resident) if peak is not None and resident is not None else 0
    tell_parent(conn, Bounded(value, spent, grown, _own_cpu()))


def _answer(receive: Connection, pid: int | None, cpu_seconds: float, wall_seconds: float) -> Any:
    """What the worker `pid` sends once it has started; BuildTimeout once it has used `cpu_seconds` of CPU
    since it started, or `wall_seconds` have passed."""
    started = receive.recv() if receive.poll(START_SECONDS) else None
    start_cpu = started[1] if isinstance(started, tuple) else 0.0
    deadline = time.monotonic() + wall_seconds
    left = cpu_seconds
    while not receive.poll(max(0.0, min(POLL_SECONDS, left / 2, deadline - time.monotonic()))):
        used = _cpu_of(pid)  # before any kill: the fork server reaps it
        if used is not None:
            left = max(0.005, cpu_seconds - (used - start_cpu))
            if used - start_cpu > cpu_seconds:
                raise BuildTimeout(f"building an entry took more than {cpu_seconds:g} CPU-s", used)
        if time.monotonic() >= deadline:
            used = wall_seconds if used is None else used
            raise BuildTimeout(f"building an entry took more than {wall_seconds:g} s of wall clock", used, wall=True)
    return receive.recv()


def run_bounded(
    work: Callable[..., Any],
    args: tuple,
    *,
    cpu_seconds: float = BUILD_CPU_SECONDS,
    wall_seconds: float = BUILD_WALL_SECONDS,
    memory_bytes: int = MEMORY_BYTES,
    name: str = "sapo-build",
) -> Bounded:
    """`work(*args)` in a worker process that is killed once it has used `cpu_seconds` of CPU or after
    `wall_seconds` (both from its start, not counting the fork server's) and may add at most
    `memory_bytes`. `work` must be importable by name (a module-level function) and its arguments and
    value picklable. Raises BuildTimeout when it ran out of time, BuildFailed with its message when it
    raised or its worker died; both say the worker's CPU seconds."""
    ctx = worker_context()
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_worker, args=(send, cpu_seconds, memory_bytes, work, args), daemon=True, name=name)
    begun = time.monotonic()
    process.start()
    send.close()
    try:
        try:
            answer = _answer(receive, process.pid, cpu_seconds, wall_seconds)
        except (EOFError, OSError):  # killed by the kernel: out of memory or CPU, or crashed
            process.join(timeout=5)
            if process.exitcode == -signal.SIGXCPU:  # the parent was too slow to kill it: the kernel did
                answer = BuildTimeout(f"building an entry took more than {cpu_seconds:g} CPU-s", cpu_seconds)
            else:
                answer = BuildFailed("the build stopped without finishing (out of memory?)", time.monotonic() - begun)
    finally:
        process.kill()
        process.join(timeout=5)
        receive.close()
    if isinstance(answer, (BuildFailed, BuildTimeout)):
        raise answer
    if not isinstance(answer, Bounded):
        raise BuildFailed(f"the worker answered {type(answer).__name__}")
    return answer


def first_entry(dataset: str, config: dict[str, Any]) -> None:
    """The first buildable entry of (dataset, config), built and dropped: the work a cost is measured on."""
    build_first(TaskSpec(dataset, config), 0, itertools.count())


def _build_first(conn: Connection, dataset: str, config: dict[str, Any], memory_bytes: int) -> None:
    """A build worker of `first_entry`, under BUILD_CPU_SECONDS."""
    _worker(conn, BUILD_CPU_SECONDS, memory_bytes, first_entry, (dataset, dict(config)))


def build_first_bounded(
    dataset: str,
    config: dict[str, Any],
    *,
    cpu_seconds: float = BUILD_CPU_SECONDS,
    wall_seconds: float = BUILD_WALL_SECONDS,
    memory_bytes: int = MEMORY_BYTES,
) -> BuildCost:
    """Build the first entry of (dataset, config) (tasks.build_first) in a worker process bounded as
    `run_bounded`'s: for a configuration nobody has reviewed (a catalogue staff save), with which
    reasoning-gym could build for ever. Returns what the build cost the worker; raises BuildTimeout when
    it ran out of time, BuildFailed (a RuntimeError) with reasoning-gym's message when the build failed."""
    done = run_bounded(
        first_entry,
        (dataset, dict(config)),
        cpu_seconds=cpu_seconds,
        wall_seconds=wall_seconds,
        memory_bytes=memory_bytes,
    )
    return BuildCost(done.cpu_seconds, done.peak_bytes, done.worker_seconds)
