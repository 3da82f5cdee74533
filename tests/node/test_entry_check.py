"""A catalogue entry's bounded build (sapo_node.entry_check): its worker when the process that asked
for it is gone."""

from __future__ import annotations

from sapo_node.entry_check import _build_first
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
