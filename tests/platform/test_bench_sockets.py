"""bench/sockets.py runs end to end at --quick size (its figures are docs/benchmarks.md's "Sockets")."""

from __future__ import annotations

from support.bench import BENCH, run_bench


def test_the_sockets_benchmark_runs_every_phase_on_both_servers_and_every_node_comes_back(tmp_path):
    out = run_bench("sockets.py", ["--quick", "--servers", "daphne,uvicorn"], "sapo_bench_sockets", tmp_path)
    for server in ("daphne", "uvicorn:uvloop:httptools:websockets-sansio"):
        for phase in (
            "(a) welcome, one at a time",
            "(b) welcome, all at once",
            "(b) of which the handshake",
            "(c) sample, one at a time",
            "(d) sample, all at once",
            "(e) server RSS",
            "(g) sample, steady: every 1 s",
            "(f) all back after a restart (from the kill)",
        ):
            assert f"| {server} | {phase} |" in out
    assert "| 50 |" in out  # all 50 sockets measured
    assert out.count("**0 dropped sessions**") == 2
    assert out.count("**0 failed**") == 2
    assert "load average at start" in out and "load average at end" in out
    assert ": 0 errors" in out  # the server logged no error


def test_the_sockets_benchmark_runs_on_the_lean_client(tmp_path):
    out = run_bench(
        "sockets.py", ["--quick", "--servers", "uvicorn", "--client", "lean"], "sapo_bench_sockets", tmp_path
    )
    assert "| uvicorn:uvloop:httptools:websockets-sansio | (b) welcome, all at once | 50 |" in out
    assert out.count("**0 dropped sessions**") == 1 and out.count("**0 failed**") == 1
    assert ": 0 errors" in out


def test_the_sockets_benchmark_runs_each_server_from_each_tree(tmp_path):
    """--trees: the same server from two source trees in one run (here this checkout twice)."""
    root = str(BENCH.parent)
    out = run_bench("sockets.py", ["--quick", "--trees", f"{root},{root}"], "sapo_bench_sockets", tmp_path)
    assert f"tree 0: {root}\ntree 1: {root}\n" in out
    for tree in (0, 1):
        assert f"| daphne (tree {tree}) | (b) welcome, all at once | 50 |" in out
        assert f"| daphne (tree {tree}) | (f) all back after a restart (from the kill) | 50 |" in out
    assert out.count("**0 dropped sessions**") == 2
    assert ": 0 errors" in out
