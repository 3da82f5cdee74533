"""Building an entry of a configuration nobody has reviewed, bounded: a catalogue staff save names
reasoning-gym keyword arguments, and some make it build for ever (a chain_sum of millions of terms) or
take the machine's memory. The build runs in a worker process from the sandbox's fork server
(verifiers.sandbox), with the sandbox's memory limit, and is killed when its time is up.
"""

from __future__ import annotations

import itertools
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


def _build_first(conn: Connection, dataset: str, config: dict[str, Any], memory_bytes: int) -> None:
    """A build worker: the first buildable entry of (dataset, config); sends None, or what went wrong."""
    if resource is not None:
        size = vm_bytes()
        if size is not None:
            resource.setrlimit(resource.RLIMIT_AS, (size + memory_bytes, size + memory_bytes))
    if not tell_parent(conn, "started"):  # the clock starts here, not while the fork server imports reasoning-gym
        return
    try:
        build_first(TaskSpec(dataset, config), 0, itertools.count())
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, whatever reasoning-gym raised
        tell_parent(conn, f"{exc}" or type(exc).__name__)
        return
    tell_parent(conn, None)


def build_first_bounded(
    dataset: str, config: dict[str, Any], *, seconds: float = BUILD_SECONDS, memory_bytes: int = MEMORY_BYTES
) -> None:
    """Build the first entry of (dataset, config) (tasks.build_first) in a worker process that is killed
    after `seconds` of wall clock and may add at most `memory_bytes`: for a configuration nobody has
    reviewed (a catalogue staff save), with which reasoning-gym could build for ever. Raises BuildTimeout
    when it ran out of time, RuntimeError with reasoning-gym's message when the build failed."""
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
            error = receive.recv()
        except (EOFError, OSError):  # killed by the kernel: out of memory, or crashed
            error = "the build stopped without finishing (out of memory?)"
    finally:
        process.kill()
        process.join(timeout=5)
        receive.close()
    if error is not None:
        raise RuntimeError(error)
