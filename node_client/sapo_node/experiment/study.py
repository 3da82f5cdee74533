"""A study: for every seed and configuration, a fresh pool and a fresh swarm, R rounds round-robin;
then the analysis (analysis.py) of the rows collected in rounds.csv.

Runs go seed by seed (every configuration of seed 1, then of seed 2, ...), so a study cut short
still compares configurations on the seeds it finished; `--resume` skips the runs already complete
in rounds.csv.
"""

from __future__ import annotations

import json
import os
import platform as _platform
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sapo_node import __version__
from sapo_node.experiment.analysis import analyse, read_rounds, write_rounds
from sapo_node.experiment.presets import StudyConfig, node_options
from sapo_node.experiment.server import DEFAULT_ROOT, Platform
from sapo_node.progress import progress_bar

#: Node k's seed in the run of study seed s: the same in every configuration.
NODE_SEED_STRIDE = 1000

#: How often a node's transport polls; short, because in a study every node turn is short.
POLL_INTERVAL = 0.25


def node_seed(seed: int, node: int) -> int:
    return seed * NODE_SEED_STRIDE + node


def node_name(node: int) -> str:
    return f"node-{node}"


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def out_dir(cfg: StudyConfig) -> Path:
    return Path(cfg.out or Path("results") / cfg.preset)


def complete_runs(rows: list[dict[str, Any]], cfg: StudyConfig) -> set[tuple[str, int]]:
    counts: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["config"], row["seed"])
        counts[key] = counts.get(key, 0) + 1
    return {key for key, n in counts.items() if n == cfg.nodes * cfg.rounds}


def run_study(cfg: StudyConfig, *, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run every (seed, configuration) of `cfg` and analyse; returns the summary (summary.json)."""
    import torch

    from sapo_node.models import load_policy

    cfg.validate()
    out = out_dir(cfg)
    rounds_csv = out / "rounds.csv"
    if rounds_csv.exists() and not resume:
        raise FileExistsError(f"{rounds_csv} exists: give --resume to continue that study, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "study.json")
    done = complete_runs(read_rounds(rounds_csv), cfg) if resume and rounds_csv.exists() else set()
    if resume and rounds_csv.exists():  # drop the rows of a run cut short; it is run again
        kept = [r for r in read_rounds(rounds_csv) if (r["config"], r["seed"]) in done]
        write_rounds(rounds_csv, kept)

    torch.set_num_threads(cfg.threads or cpu_threads())
    started = time.time()
    initial = {}
    for model in dict.fromkeys(cfg.node_models()):
        policy = load_policy(model, device=cfg.device, dtype=None if cfg.dtype == "auto" else cfg.dtype)
        initial[model] = policy[0], policy[1]
    names = [node_name(k) for k in range(1, cfg.nodes + 1)]
    platform = Platform(
        root=Path(cfg.platform_root) if cfg.platform_root else DEFAULT_ROOT, catalogue=cfg.catalogue,
        log_dir=out / "logs", database_url=cfg.database_url,
    )  # fmt: skip

    plan = [(seed, label, local, external) for seed in cfg.seeds for label, local, external in cfg.counts()]
    todo = [p for p in plan if (p[1], p[0]) not in done]
    timings: list[dict[str, Any]] = []
    runs_bar = progress_bar(total=len(plan), initial=len(plan) - len(todo), desc="runs", unit="run", position=0,
                    disable=not progress, dynamic_ncols=True, file=sys.stderr)  # fmt: skip
    try:
        with platform.session(names):
            for seed, label, local, external in todo:
                if cfg.time_limit and time.time() - started > cfg.time_limit:
                    print(f"time limit ({cfg.time_limit:g} s) reached: continue with --resume", file=sys.stderr)
                    break
                runs_bar.set_description(f"runs ({label}, seed {seed})")
                run_started = time.time()
                rows = run_swarm(cfg, platform, initial, seed=seed, label=label, local=local, external=external,
                                 out=out, progress=progress)  # fmt: skip
                write_rounds(rounds_csv, rows, append=True)
                timings.append({"config": label, "seed": seed, "seconds": round(time.time() - run_started, 2)})
                runs_bar.update(1)
    finally:
        runs_bar.close()

    meta = {
        "study": cfg.to_json(),
        "client": f"sapo-node/{__version__}",
        "torch_threads": torch.get_num_threads(),
        "machine": f"{_platform.machine()}, {cpu_threads()} cores",
        "seconds": round(time.time() - started, 1),
        "run_seconds": timings,
    }
    prior = _previous_meta(out)
    if prior and resume:
        meta["run_seconds"] = prior.get("run_seconds", []) + timings
    return analyse(read_rounds(rounds_csv), out, window=cfg.window, method=cfg.test, sig_window=cfg.sig_window,
                   meta=meta)  # fmt: skip


def _previous_meta(out: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out / "summary.json").read_text()).get("meta")
    except (OSError, ValueError):
        return None


def run_swarm(
    cfg: StudyConfig,
    platform: Platform,
    initial: dict[str, tuple[Any, Any]],
    *,
    seed: int,
    label: str,
    local: int,
    external: int,
    out: Path,
    progress: bool = True,
    on_round: Callable[[int, list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """One run: a fresh pool, N nodes from their initial weights (`initial`: by model), R rounds round-robin.
    Returns one row per node per round (analysis.ROUND_FIELDS)."""
    from sapo_node.config import NodeConfig
    from sapo_node.experiment.swarm import SwarmNode, clone_policy
    from sapo_node.transport import OUTBOX_FILE
    from sapo_node.transport.websocket import WebSocketTransport

    options = node_options(label)
    run_label = f"{label.replace('/', '-')}-s{seed}"
    run_dir = out / "runs" / run_label
    if run_dir.exists():  # a run cut short: its outboxes hold groups of a pool that no longer exists
        shutil.rmtree(run_dir)
    rows: list[dict[str, Any]] = []
    with platform.run(run_label.replace("-", "_")) as url:
        nodes: list[SwarmNode] = []
        try:
            for k, model in enumerate(cfg.node_models(), start=1):
                name = node_name(k)
                config = NodeConfig(
                    server=url, token=platform.tokens[name], model=model, device=cfg.device, dtype=cfg.dtype,
                    out=str(run_dir / name), seed=node_seed(seed, k), rounds=cfg.rounds, questions=cfg.questions,
                    generations=cfg.generations, local=local, external=external, catalogue=cfg.catalogue,
                    max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lr=cfg.lr,
                    micro_batch=cfg.micro_batch, checkpoint_every=0, connect_wait=cfg.connect_wait,
                    flush_wait=cfg.flush_wait, **options,
                )  # fmt: skip
                (run_dir / name).mkdir(parents=True, exist_ok=True)
                transport = WebSocketTransport(url, config.token, run_dir / name / OUTBOX_FILE, buffer_size=external,
                                               max_buffer_size=external, poll_interval=POLL_INTERVAL)  # fmt: skip
                nodes.append(SwarmNode.start(k, config, transport, clone_policy(initial[model])))
                if (catalogue := transport.catalogue()) is None or catalogue.name != cfg.catalogue:
                    raise RuntimeError(f"the server does not serve catalogue {cfg.catalogue!r}")

            bar = progress_bar(total=cfg.rounds, desc=f"{label} seed {seed}", unit="round", position=1, leave=False,
                       disable=not progress, dynamic_ncols=True, file=sys.stderr)  # fmt: skip
            try:
                for n in range(1, cfg.rounds + 1):
                    round_rows = []
                    for node in nodes:
                        row = node.step()
                        # The node's turn ends when the server has its shares: the next nodes may sample them.
                        if not node.transport.flush(cfg.flush_wait):
                            raise RuntimeError(
                                f"the server did not acknowledge node {node.index}'s shares within {cfg.flush_wait} s "
                                f"({node.transport.status}); see {platform.log_dir}"
                            )
                        round_rows.append(_csv_row(row, label=label, local=local, external=external, seed=seed,
                                                   node=node.index))  # fmt: skip
                    rows.extend(round_rows)
                    if on_round is not None:
                        on_round(n, round_rows)
                    mean = sum(r["reward_mean"] for r in round_rows) / len(round_rows)
                    bar.set_postfix(reward=f"{mean:.3f}", ext=sum(r["external_kept"] for r in round_rows))
                    bar.update(1)
            finally:
                bar.close()
        finally:
            for node in nodes:
                node.close(cfg.flush_wait)
    return rows


def _csv_row(row: dict[str, Any], *, label: str, local: int, external: int, seed: int, node: int) -> dict[str, Any]:
    return {
        "config": label,
        "local": local,
        "external": external,
        "seed": seed,
        "node": node,
        "round": row["round"],
        "reward_mean": round(row["reward_mean"], 6),
        "reward_std": round(row["reward_std"], 6),
        "completions": row["completions"],
        "local_kept": row["local_kept"],
        "external_kept": row["external_kept"],
        "external_offered": row["external_offered"],
        "external_invalid": row["external_invalid"],
        "zero_advantage_share": round(row["zero_advantage_share"], 4),
        "loss": round(row["loss"], 6),
        "clip_fraction": round(row["clip_fraction"], 4),
        "accepted": row["accepted"],
        "rejected": row["rejected"],
        "pending": row["pending"],
        "seconds": row["seconds"]["total"],
        "questions": row["questions"],
        "question_rewards": ";".join(f"{r:.4f}" for r in row["question_rewards"]),
    }
