"""CPU of one `share` in process: `parse_frame` + `rollout_share` over bench/pool.py's frames, the
server thread's CPU time per share and the PostgreSQL backend's, without daphne or sockets.

    .venv/bin/python bench/share_cpu.py                         # this tree, with the moderation rules
    .venv/bin/python bench/share_cpu.py --trees /tmp/main,.     # two trees in alternation (3 runs each)
    .venv/bin/python bench/share_cpu.py --stages                # and the CPU of each stage of a share
    .venv/bin/python bench/share_cpu.py --runs 1 --profile /tmp/share   # cProfile of the counted shares
    .venv/bin/python bench/share_cpu.py --sizes 1,8,32,64       # a share's fixed cost and its cost per group
    .venv/bin/python bench/share_cpu.py --coalesce 1,4          # shares alone, and four nodes' shares stored together
    .venv/bin/python bench/share_cpu.py --trees /tmp/main,.,.@4  # another tree, this one, this one 4 at a time

Each run is a subprocess with the tree's own `platform` and `node_client` on its path, in a database
of its own (created, migrated with the tree's migrations, dropped) on DATABASE_URL's server. The
frames are bench/pool.py's (4 nodes x 30 shares of 32 groups x 8 completions of ~300 characters,
easy catalogue), the nodes' shares interleaved; the first `--warmup` shares are not counted. The
backend's CPU is read from /proc/<backend pid>/stat (utime + stime, clock ticks: 10 ms resolution,
so it is summed over every share of a pass). Prints the load average with each run: on a shared
machine compare runs taken in alternation only.

`--sizes` runs shares of each of these group counts (in alternation with each other and with the
trees; about as many groups per run at every size: `--messages` is scaled, at most 240 per node) and
fits CPU per share = fixed + per group x groups, by least squares over the medians: what a share costs
whatever its size, against what each group adds.

`--coalesce K` hands K consecutive shares (the nodes' shares are interleaved, so K different nodes
when K <= --connections) to `pool.ingest.rollout_share_batch` together, as the server does when
shares wait for a turn at once; the CPU is still given per share. Several values (`--coalesce 1,4`)
are measured in alternation, like the trees, a column each.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchkit import pool_bench, tree_run

HERE = Path(__file__).resolve().parent

#: Stages timed with --stages: module, attribute (the functions rollout_share reaches by module globals).
STAGES = [
    ("pool.ingest", "storage_check", "storage check"),
    ("pool.ingest", "verify_rollout", "verification"),
    ("pool.ingest", "insert_batch", "the pool's INSERT"),
    ("pool.services", "storage_check", "storage check"),  # trees before pool.ingest
    ("pool.services", "verify_rollout", "verification"),
    ("pool.services", "_insert_rollouts", "the pool's INSERT"),
    ("moderation.filters", "fingerprints", "fingerprints"),
    ("moderation.filters", "length_findings", "length rule"),
    ("moderation.filters", "character_findings", "characters rule"),
    ("moderation.filters", "copy_findings", "copy lookups"),
    ("moderation.screening", "_screening_reads", "candidates and trust query"),
    ("moderation.screening", "rollouts_record", "the rules' record statement"),  # trees before 2026-11-24
    ("moderation.screening", "rollouts_record_part", "the rules' record (its part of the INSERT)"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--trees", default=str(HERE.parent), help="comma-separated source trees, run in alternation")
    parser.add_argument("--runs", type=int, default=3, help="runs of each tree")
    parser.add_argument("--passes", type=int, default=2, help="passes over the frames per run (groups deleted between)")
    parser.add_argument("--warmup", type=int, default=8, help="shares not counted at the start of each pass")
    parser.add_argument("--moderation", default="on", choices=["on", "off"])
    parser.add_argument("--stages", action="store_true", help="also time each stage (wrappers cost a little)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--completion-chars", type=int, default=300)
    parser.add_argument("--catalogue", default="easy", choices=["easy", "sapo"])
    parser.add_argument(
        "--sizes",
        help="comma-separated groups per share, each measured with about --groups x --messages groups per node",
    )
    parser.add_argument(
        "--coalesce", default="1", help="shares stored together (rollout_share_batch); comma-separated: each a column"
    )
    parser.add_argument("--profile", metavar="FILE", help="cProfile each run's shares into FILE.<run> (pstats)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # tree of a subprocess run
    parser.add_argument("--db-name", default="sapo_share_cpu", help=argparse.SUPPRESS)
    return parser.parse_args()


def child(args: argparse.Namespace) -> None:
    with tree_run(args, SAPO_CONN_MAX_AGE="600") as bench_pool:
        run(args, bench_pool)


def run(args: argparse.Namespace, bench_pool) -> None:  # noqa: ANN001
    import importlib

    from django.db import connection

    from pool.limits import current_limits
    from pool.models import Rollout
    from pool.seams import NO_MODERATION, moderation_register
    from sockets.messages import parse_frame
    from swarms.selectors import swarm_place
    from swarms.services import swarm_default_ensure

    try:
        from pool.ingest import rollout_share
    except ImportError:  # a tree before pool.ingest
        from pool.services import rollout_share
    try:
        from pool.ingest_statement import SwarmOfBatch
    except ImportError:  # a tree before swarms: every group in the one pool
        SwarmOfBatch = None

    if args.moderation == "off":
        moderation_register(NO_MODERATION)
    stage_cpu: dict[str, float] = {}
    backend_pid: list[int] = []  # set once connected: --stages reads the backend's ticks around each stage
    if args.stages:
        for module_name, attr, label in STAGES:
            module = importlib.import_module(module_name)
            if not hasattr(module, attr):
                continue
            inner = getattr(module, attr)

            def timed(*a, _inner=inner, _label=label, **kw):  # noqa: ANN002, ANN003, ANN202
                b0 = bench_pool.process_cpu(backend_pid[0]) if backend_pid else 0.0
                t0 = time.thread_time()
                try:
                    return _inner(*a, **kw)
                finally:
                    stage_cpu[_label] = stage_cpu.get(_label, 0.0) + time.thread_time() - t0
                    if backend_pid:
                        spent = bench_pool.process_cpu(backend_pid[0]) - b0
                        stage_cpu["PostgreSQL: " + _label] = stage_cpu.get("PostgreSQL: " + _label, 0.0) + spent

            setattr(module, attr, timed)
        if "moderation.screening" in sys.modules:  # the seam holds the functions themselves
            from moderation import hooks, screening

            for name in ("rollouts_record", "rollouts_record_part"):  # whichever the tree has
                if hasattr(hooks.Moderation, name):
                    setattr(hooks.Moderation, name, staticmethod(getattr(screening, name)))

    nodes = [node for node, _ in bench_pool.make_nodes(args.connections, "cpu")]
    frames = bench_pool.build_frames(args, seeds=[1000 + i for i in range(args.connections)])
    order = [(c, m) for m in range(args.messages) for c in range(args.connections)]
    limits, place = current_limits(), swarm_place(swarm=swarm_default_ensure())
    catalogue = place.catalogue
    in_swarm = {} if SwarmOfBatch is None else {"swarm": SwarmOfBatch(place.swarm_id, place.catalogue_version)}
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    backend_pid.append(pid)
    # As the consumer does: each node's share checks its storage budgets against what its previous share
    # left (rollout_share's `stored`, where the tree has it).
    remembers = "stored" in inspect.signature(rollout_share).parameters
    stored: dict[int, object] = {}
    counted = 0
    server = backend = parse = 0.0
    stages: dict[str, float] = {}
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    together = int(args.coalesce)
    if together > 1:
        try:
            from pool.ingest import ShareIn, rollout_share_batch
        except ImportError:  # a tree before pool.ingest
            from pool.services import ShareIn, rollout_share_batch
    for _ in range(args.passes):
        Rollout.objects.all().delete()
        counting = False
        for start in range(0, len(order), together):
            chunk = order[start : start + together]
            if not counting and start >= args.warmup:
                counting = True
                t_backend = bench_pool.process_cpu(pid)
                t_stages = dict(stage_cpu)
                if profiler is not None:
                    profiler.enable()
            t0 = time.thread_time()
            messages = [parse_frame(frames[c][m], limits) for c, m in chunk]
            t1 = time.thread_time()
            if together == 1:
                (c, _), (message,) = chunk[0], messages
                kwargs = {"stored": stored.get(c)} if remembers else {}
                result = rollout_share(
                    node=nodes[c], rollouts=message.rollouts, catalogue=catalogue, limits=limits, **kwargs, **in_swarm
                )
                stored[c] = getattr(result, "stored", None)
            else:
                shares = [
                    ShareIn(node=nodes[c], rollouts=message.rollouts, stored=stored.get(c))
                    for (c, _), message in zip(chunk, messages, strict=True)
                ]
                answers = rollout_share_batch(shares=shares, catalogue=catalogue, limits=limits, **in_swarm)
                for (c, _), result in zip(chunk, answers, strict=True):
                    if isinstance(result, Exception):
                        raise result
                    stored[c] = result.stored
            t2 = time.thread_time()
            if counting:
                server += t2 - t0
                parse += t1 - t0
                counted += len(chunk)
        backend += bench_pool.process_cpu(pid) - t_backend
        if profiler is not None:
            profiler.disable()
        for label, cpu in stage_cpu.items():  # the warm-up's share of the stages is not counted
            stages[label] = stages.get(label, 0.0) + cpu - t_stages.get(label, 0.0)
    stages = {"parse_frame": parse, **stages}
    if profiler is not None:
        profiler.dump_stats(f"{args.profile}.{os.getpid()}")
    print(
        json.dumps(
            {
                "shares": counted,
                "server_ms": 1000 * server / counted,
                "backend_ms": 1000 * backend / counted,
                "stages_ms": {k: 1000 * v / counted for k, v in stages.items()},
            }
        )
    )


def sized_argv(args: argparse.Namespace, size: int | None) -> list[str]:
    """The child's arguments: this run's, with `size` groups per share and messages scaled so that every
    size shares about as many groups as --groups x --messages (at most 240 shares per node)."""
    if size is None:
        return sys.argv[1:]
    messages = max(args.warmup + 1, min(240, round(args.groups * args.messages / size)))
    return [*sys.argv[1:], "--groups", str(size), "--messages", str(messages)]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares line through (groups, ms per share): (fixed ms per share, ms per group)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def print_sizes(args: argparse.Namespace, trees: list[str], sizes: list[int], results: dict) -> None:
    per_completion = args.completions
    print(f"\nmedians, ms of CPU per share by groups per share ({per_completion} completions each):")
    print("| tree | groups | server ms/share | PostgreSQL ms/share | us/completion (both) |")
    print("|---|---:|---:|---:|---:|")
    for tree in trees:
        medians = {}
        for size in sizes:
            rs = results[(tree, size)]
            server = statistics.median(r["server_ms"] for r in rs)
            backend = statistics.median(r["backend_ms"] for r in rs)
            medians[size] = (server, backend)
            total = 1000 * (server + backend) / (size * per_completion)
            print(f"| {tree} | {size} | {server:.2f} | {backend:.2f} | {total:.1f} |")
        if len(sizes) > 1:
            for label, k in (("server", 0), ("PostgreSQL", 1)):
                fixed, slope = fit([(size, medians[size][k]) for size in sizes])
                # (a total of 0: PostgreSQL's CPU is read in 10 ms ticks, which a tiny run may not reach)
                shares = ", ".join(
                    f"{100 * fixed / (fixed + slope * g):.0f}% at {g}" if fixed + slope * g > 0 else f"- at {g}"
                    for g in sizes
                )
                print(f"{tree}: {label}: {fixed:.2f} ms per share + {slope:.3f} ms per group (fixed part: {shares})")


def main() -> None:
    args = parse_args()
    if args.child:
        child(args)
        return
    coalesce = list(dict.fromkeys(int(k) for k in args.coalesce.split(",")))
    # A column per tree and --coalesce value: "tree" alone, or "tree xK" when several values are compared
    # or the tree is given as "tree@K" (that value for this tree only).
    columns: dict[str, tuple[str, int]] = {}
    for entry in args.trees.split(","):
        tree, at, k = entry.partition("@")
        path = str(Path(tree).resolve())
        for together in [int(k)] if at else coalesce:
            label = f"{path} x{together}" if at or len(coalesce) > 1 else path
            columns[label] = (path, together)
    if not all(1 <= k <= args.connections for _, k in columns.values()):
        raise SystemExit(f"--coalesce: from 1 to --connections ({args.connections}): one share per node in a batch")
    trees = list(columns)
    sizes: list[int | None] = [None]
    if args.sizes:
        if args.stages:
            raise SystemExit("--sizes and --stages: measure the stages at one size (--groups) instead")
        sizes = list(dict.fromkeys(int(s) for s in args.sizes.split(",")))
        if min(sizes) < 1:
            raise SystemExit("--sizes: group counts of 1 or more")
    configs = [(tree, size) for size in sizes for tree in trees]
    results: dict[tuple[str, int | None], list[dict]] = {c: [] for c in configs}
    tree_path = pool_bench().tree_path
    for r in range(args.runs):
        for tree, size in configs if r % 2 == 0 else configs[::-1]:
            load = os.getloadavg()[0]
            path, together = columns[tree]
            cmd = [sys.executable, __file__, "--child", path, *sized_argv(args, size), "--coalesce", str(together)]
            env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings", SAPO_CATALOGUE=args.catalogue)
            env["PYTHONPATH"] = os.pathsep.join(tree_path(Path(path)))
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result["load"] = (load, os.getloadavg()[0])
            results[(tree, size)].append(result)
            groups = "" if size is None else f"{size} groups, "
            print(
                f"{tree}: server {result['server_ms']:.2f} ms, PostgreSQL backend {result['backend_ms']:.2f} ms"
                f" per share ({groups}{result['shares']} shares; load {load:.2f} -> {result['load'][1]:.2f})",
                flush=True,
            )
    if args.sizes:
        print_sizes(args, trees, [s for s in sizes if s is not None], results)
        return
    by_tree = {tree: results[(tree, None)] for tree in trees}
    print(f"\nmedians, ms of CPU per share (moderation rules {args.moderation}):")
    labels = list(dict.fromkeys(k for rs in by_tree.values() for r in rs for k in r["stages_ms"]))
    rows = [("server (parse_frame + rollout_share)", "server_ms"), ("PostgreSQL backend", "backend_ms")]
    print("| stage | " + " | ".join(trees) + " |")
    for label, key in rows:
        print(
            f"| {label} | " + " | ".join(f"{statistics.median(r[key] for r in by_tree[t]):.2f}" for t in trees) + " |"
        )
    if args.stages:
        for label in labels:
            cells = []
            for t in trees:
                values = [r["stages_ms"][label] for r in by_tree[t] if label in r["stages_ms"]]
                cells.append(f"{statistics.median(values):.2f}" if values else "-")
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
