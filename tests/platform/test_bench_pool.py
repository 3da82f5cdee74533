"""bench/pool.py's ingest part runs end to end at tiny sizes: every path measured in each round, in
alternation, each measure with its load average (its figures are docs/benchmarks.md's)."""

from __future__ import annotations

import os
import re

from support.bench import run_bench


def test_the_ingest_benchmark_measures_every_path_in_every_round_with_the_load(tmp_path):
    args = ["--skip-sample", "--connections", "2", "--messages", "2", "--groups", "2", "--rounds", "2", "--force"]
    out = run_bench("pool.py", args, "sapo_bench_pool", tmp_path)
    for path in ("with moderation rules", "without moderation rules", "executemany", "COPY"):
        rows = [line for line in out.splitlines() if line.startswith("|") and path in line and " | 1 |" in line]
        rows += [line for line in out.splitlines() if line.startswith("|") and path in line and " | 2 |" in line]
        assert len(rows) == 2, (path, out)
        assert all(line.rstrip(" |").split("|")[-1].count("-") == 1 for line in rows)  # load start-end
        for line in rows:  # the CPU per completion of the process(es) and of PostgreSQL (local here)
            cells = [c.strip() for c in line.strip(" |").split("|")]
            assert float(cells[3]) >= 0 and float(cells[4]) >= 0, line
    assert "/ executemany" in out and "load average at end" in out
    assert "CPU us/completion (process + PostgreSQL)" in out


def test_the_share_cpu_benchmark_prints_server_and_database_cpu_per_share_and_its_stages(tmp_path):
    args = ["--connections", "2", "--messages", "3", "--groups", "2", "--warmup", "1", "--runs", "1", "--stages"]
    out = run_bench("share_cpu.py", args, "sapo_share_cpu", tmp_path)
    assert "(10 shares; load" in out, out  # 2 passes x (2 x 3 shares - 1 of warm-up)
    for label in ("server (parse_frame + rollout_share)", "PostgreSQL backend", "fingerprints", "verification"):
        assert f"| {label} |" in out, out


def test_the_share_cpu_benchmark_fits_a_shares_fixed_cost_and_its_cost_per_group(tmp_path):
    args = ["--connections", "2", "--messages", "4", "--groups", "2", "--warmup", "1", "--runs", "1"]
    out = run_bench("share_cpu.py", [*args, "--sizes", "1,4"], "sapo_share_cpu_sizes", tmp_path)
    # each size measured, with about as many groups: 2 x 8 shares of 1 group, 2 x 2 shares of 4
    assert "per share (1 groups, 30 shares; load" in out, out  # 2 passes x (2 x 8 - 1 of warm-up)
    assert "per share (4 groups, 6 shares; load" in out, out  # 2 passes x (2 x 2 - 1)
    rows = [line.strip(" |").split("|") for line in out.splitlines() if line.startswith("| /")]
    assert [int(r[1]) for r in rows] == [1, 4], out
    # the server's CPU, and both together per completion; PostgreSQL's is read in 10 ms ticks, which
    # so few shares may not reach
    assert all(float(r[2]) > 0 and float(r[3]) >= 0 and float(r[4]) > 0 for r in rows), out
    for label in ("server", "PostgreSQL"):
        fitted = next(line for line in out.splitlines() if f": {label}: " in line and "ms per share +" in line)
        # (a fit over so few ticks may come out negative: the line is printed as fitted)
        assert re.search(r"fixed part: (-?\d+%|-) at 1, (-?\d+%|-) at 4\)$", fitted), fitted


def test_the_ingest_benchmark_measures_pinned_workers_on_cores_of_their_own(tmp_path):
    args = ["--skip-sample", "--connections", "2", "--messages", "2", "--groups", "2", "--rounds", "2", "--force"]
    out = run_bench("pool.py", [*args, "--moderation", "on", "--pin", "both"], "sapo_bench_pin", tmp_path)
    lines = out.splitlines()
    for label in ("with moderation rules, 1 worker |", "with moderation rules, 1 worker, pinned |"):
        assert sum(1 for line in lines if line.startswith("| WebSocket share") and label in line) == 3, out
    cores = sorted(os.sched_getaffinity(0))
    where = next(line for line in lines if line.endswith("]") and ", pinned: workers on cores" in line)
    # the worker alone on the last core, read back from the kernel; the clients on the others
    expected_clients = cores[:-1] or cores
    assert where.endswith(f"workers on cores [[{cores[-1]}]], clients on cores {expected_clients}"), where


def test_the_share_cpu_benchmark_measures_shares_alone_and_stored_together_in_alternation(tmp_path):
    args = ["--connections", "2", "--messages", "4", "--groups", "2", "--warmup", "2", "--runs", "1", "--passes", "1"]
    out = run_bench("share_cpu.py", [*args, "--coalesce", "1,2"], "sapo_share_cpu_together", tmp_path)
    # 2 x 4 shares, the first 2 not counted, alone and two at a time
    assert sum("x1: server" in line and "per share (6 shares; load" in line for line in out.splitlines()) == 1, out
    assert sum("x2: server" in line and "per share (6 shares; load" in line for line in out.splitlines()) == 1, out
    header = next(line for line in out.splitlines() if line.startswith("| stage |"))
    assert header.endswith(" x1 | " + header.split(" | ")[1].removesuffix(" x1") + " x2 |"), header
    server = next(line for line in out.splitlines() if line.startswith("| server"))
    assert all(float(cell) > 0 for cell in server.strip(" |").split("|")[1:]), server


def test_the_ingest_benchmark_measures_shares_alone_and_together_with_each_worker_count(tmp_path):
    args = ["--skip-sample", "--connections", "3", "--messages", "2", "--groups", "2", "--rounds", "1", "--force"]
    out = run_bench("pool.py", [*args, "--moderation", "on", "--share-batch", "1,3"], "sapo_bench_batch", tmp_path)
    lines = out.splitlines()
    for label in ("1 worker, shares alone |", "1 worker, up to 3 shares together |"):
        # the round's row and the medians' row
        assert sum(1 for line in lines if line.startswith("| WebSocket share") and label in line) == 2, out


def test_the_ingest_benchmark_runs_the_servers_of_each_tree_in_alternation(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ["--skip-sample", "--connections", "2", "--messages", "2", "--groups", "2", "--rounds", "2", "--force"]
    out = run_bench("pool.py", [*args, "--moderation", "on", "--trees", f"{root},{root}"], "sapo_bench_trees", tmp_path)
    for tree in (0, 1):
        label = f"with moderation rules, 1 worker, tree {tree} ({root}) |"
        assert sum(1 for line in out.splitlines() if line.startswith("| WebSocket share") and label in line) == 3, out


def test_the_sampling_benchmark_times_each_pool_size_and_gets_whole_samples(tmp_path):
    """bench/pool.py's sampling part: copies of the filled database per size (none of its own sessions
    left on the template), each size timed in alternation, every call answered with n groups."""
    args = ["--skip-ingest", "--sizes", "100,400", "--samples", "5", "--n", "4"]
    out = run_bench("pool.py", args, "sapo_bench_sample", tmp_path)
    rows = [line.strip(" |").split("|") for line in out.splitlines() if re.match(r"\| [\d,]+ \| ", line)]
    assert [r[0].strip() for r in rows] == ["100", "400"], out
    assert all(float(r[5]) == 4.0 for r in rows), out  # groups per call
    assert "load average at end" in out


def test_the_sampling_benchmark_times_each_tree_in_its_own_process_in_alternation(tmp_path):
    """--trees with sampling: each tree's rollout_sample in a child of its own, on a database made with
    its migrations (dropped when the child ends), the trees timed 10 calls at a time in turn."""
    import psycopg

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = ["--skip-ingest", "--sizes", "200", "--samples", "25", "--n", "4", "--trees", f"{root},{root}"]
    out = run_bench("pool.py", args, "sapo_bench_sample_trees", tmp_path)
    rows = [line.strip(" |").split("|") for line in out.splitlines() if re.match(r"\| 200, tree \d ", line)]
    assert [r[0].strip() for r in rows] == [f"200, tree 0 ({root})", f"200, tree 1 ({root})"], out
    assert all(float(r[5]) == 4.0 for r in rows), out  # groups per call
    assert f"tree 1 ({root}) / tree 0: p50 " in out and "(10 calls each, 3 blocks)" in out, out
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(url) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'sapo_bench_sample_trees%'").fetchall()
    assert left == [], left
