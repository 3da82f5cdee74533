"""A catalogue entry's bounded build (sapo_node.entry_check): its worker when the process that asked
for it is gone, and its bounds: CPU time, read by the parent and held by the kernel, and a looser wall
clock."""

from __future__ import annotations

import resource
import time

import pytest

from sapo_node.entry_check import BUILD_WALL_SECONDS, BuildTimeout, _build_first, run_bounded
from sapo_node.verifiers.sandbox import MEMORY_BYTES, worker_context


def test_a_build_worker_whose_parent_has_gone_ends_quietly():
    # Ctrl-C stops the process that asked for the build while its worker starts: the worker comes
    # from the fork server, outlives it and finds the pipe closed.
    ctx = worker_context()
    receive, send = ctx.Pipe(duplex=False)
    receive.close()
    process = ctx.Process(target=_build_first, args=(send, "basic_arithmetic", {}, MEMORY_BYTES), name="sapo-build")
    process.start()
    send.close()
    process.join(120)
    # An exception escaping the worker prints "Process sapo-build:" and its traceback, and exits 1.
    assert process.exitcode == 0


def test_work_past_its_cpu_bound_is_killed_for_its_cpu():
    started = time.monotonic()
    with pytest.raises(BuildTimeout) as timeout:
        run_bounded(sum, (range(10**12),), cpu_seconds=0.3)  # hours of CPU
    assert not timeout.value.wall and "0.3 CPU-s" in str(timeout.value)
    assert 0.3 <= timeout.value.cpu_seconds < 1.5, timeout.value.cpu_seconds
    assert time.monotonic() - started < BUILD_WALL_SECONDS


def test_work_that_uses_no_cpu_is_killed_at_its_wall_clock():
    # A worker stuck in a sleep, or kept off the CPU, uses none of its CPU bound: the wall clock ends it.
    started = time.monotonic()
    with pytest.raises(BuildTimeout) as timeout:
        run_bounded(time.sleep, (600,), wall_seconds=0.5)
    assert timeout.value.wall and timeout.value.cpu_seconds < 0.5, timeout.value.cpu_seconds
    assert time.monotonic() - started < 30


def test_the_kernel_holds_the_cpu_bound_should_the_parent_not():
    soft, hard = run_bounded(resource.getrlimit, (resource.RLIMIT_CPU,), cpu_seconds=2.0).value
    assert 3 <= soft <= 4 and hard == soft + 1, (soft, hard)  # a second past the parent's bound
