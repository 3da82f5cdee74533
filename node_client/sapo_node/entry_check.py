"""Building an entry of a configuration nobody has reviewed, bounded: a catalogue staff save names
reasoning-gym keyword arguments, and some make it build for ever (a chain_sum of millions of terms) or
take the machine's memory. The build runs in a worker process from the sandbox's fork server
(verifiers.sandbox), with the sandbox's memory limit, and is killed when its time is up.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sapo_node.datasets import TaskSpec
from sapo_node.tasks import build_first
from sapo_node.verifiers.sandbox import BUILD_SECONDS, MEMORY_BYTES, resource, tell_parent, vm_bytes, worker_context

#: Wall-clock seconds a build worker may take to start (the fork server's first start imports
#: reasoning-gym: a second of CPU, more on a loaded machine); not counted in its build's time.
START_SECONDS = 60.0


class BuildTimeout(Exception):
    """Building a dataset's entry ran out of time (`build_first_bounded`)."""


@dataclass(frozen=True)
class BuildCost:
    """What building a dataset and its first entry cost a worker: CPU seconds, and the most memory it
    held beyond its size at start (its peak resident set, Linux's VmHWM; 0 where that cannot be read)."""

    cpu_seconds: float
    peak_bytes: int


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _build_first(conn: Connection, dataset: str, config: dict[str, Any], memory_bytes: int) -> None:
    """A build worker: the first buildable entry of (dataset, config); sends its BuildCost, or what went
    wrong (a str)."""
    if resource is not None:
        size = vm_bytes()
        if size is not None:
            resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, size + memory_bytes))
    if not tell_parent(conn, "started"):  # the clock starts here, not while the fork server imports reasoning-gym
        return
    try:  # the peak from here on: Linux resets VmHWM to the resident set on "5"
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    resident = _status_bytes("VmRSS")
    started = time.process_time()
    try:
        build_first(TaskSpec(dataset, config), 0, itertools.count())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever reasoning-gym raised
        tell_parent(conn, f"{exc}" or type(exc).__name__)
        return
    peak = _status_bytes("VmHWM")
    grown = max(0, peak - resident) if peak is not None and resident is not None else 0
    tell_parent(conn, BuildCost(time.process_time() - started, grown))


def build_first_bounded(
    dataset: str, config: dict[str, Any], *, seconds: float = BUILD_SECONDS, memory_bytes: int = MEMORY_BYTES
) -> BuildCost:
    """Build the first entry of (dataset, config) (tasks.build_first) in a worker process that is killed
    after `seconds` of wall clock and may add at most `memory_bytes`: for a configuration nobody has
    reviewed (a catalogue staff save), with which reasoning-gym could build for ever. Returns what the
    build cost the worker; raises BuildTimeout when it ran out of time, RuntimeError with reasoning-gym's
    message when the build failed."""
    ctx = worker_context()
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_build_first, args=(send, dataset, dict(config), memory_bytes), daemon=True, name="sapo-build"
    )
    process.start()
    send.close()
    try:
        try:
            if receive.poll(START_SECONDS):
                receive.recv()  # "started"
            if not receive.poll(seconds):
                raise BuildTimeout(f"building an entry took more than {seconds:g} s")
            answer = receive.recv()
        except (EOFError, OSError):  # killed by the kernel: out of memory, or crashed
            answer = "the build stopped without finishing (out of memory?)"
    finally:
        process.kill()
        process.join(timeout=5)
        receive.close()
    if not isinstance(answer, BuildCost):
        raise RuntimeError(str(answer))
    return answer
