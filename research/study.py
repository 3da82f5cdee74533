"""A study: for every seed and configuration, a fresh pool and a fresh swarm, R rounds round-robin;
then the analysis (analysis.py) of the rows collected in rounds.csv.

Runs go seed by seed (every configuration of seed 1, then of seed 2, ...), so a study cut short
still compares configurations on the seeds it finished; `--resume` skips the runs already complete
in rounds.csv.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import ctypes
import dataclasses
import gc
import importlib.util
import json
import math
import os
import platform as _platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from research import heldout
from research.analysis import analyse_study, read_rounds, write_rounds
from research.heldout import HELDOUT_FILE
from research.lock import study_lock
from research.presets import StudyConfig, node_options
from research.server import DEFAULT_ROOT, Platform, PlatformError
from sapo_node import __version__
from sapo_node.machine import usable_cores
from sapo_node.progress import progress_bar
from sapo_node.tasks import CATALOGUES

if TYPE_CHECKING:
    from research.swarm import SwarmNode
    from sapo_node.config import NodeConfig
    from sapo_node.transport.websocket import WebSocketTransport

#: Node k's seed in the run of study seed s: the same in every configuration.
NODE_SEED_STRIDE = 1000

#: How often a node's transport polls; short, because in a study every node turn is short.
POLL_INTERVAL = 0.25

#: The pilot's folder inside a study's, and the file that keeps its choice.
PILOT = "pilot"
CHOICE_FILE = "choice.json"
#: How the pilot chooses (docs/experiment.md states it before any pilot runs).
PILOT_RULE = (
    "highest mean held-out accuracy of the final policies over seeds, nodes and datasets; first listed on a tie"
)


def node_seed(seed: int, node: int) -> int:
    return seed * NODE_SEED_STRIDE + node


def run_folder(config: str, seed: int) -> str:
    """A run's folder under OUT/runs/: "4/4+gate", seed 2 -> "4-4+gate-s2"."""
    return f"{config.replace('/', '-')}-s{seed}"


def node_name(node: int) -> str:
    return f"node-{node}"


def cpu_threads() -> int:
    return usable_cores()


def free_memory() -> None:
    """Give back a finished run's memory before the next run starts. A node's objects refer to one another
    (its proof-maker holds the node), so its model and optimizer, gigabytes for a real model, would
    otherwise wait for the cyclic collector well into the next run, beside the next run's own nodes.
    glibc keeps freed heap pages unless asked to return them."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def out_dir(cfg: StudyConfig) -> Path:
    return Path(cfg.out or Path("results") / cfg.preset)


def complete_runs(rows: list[dict[str, Any]], cfg: StudyConfig) -> set[tuple[str, int]]:
    counts: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["config"], row["seed"])
        counts[key] = counts.get(key, 0) + 1
    return {key for key, n in counts.items() if n == cfg.nodes * cfg.rounds}


class Stop:
    """When a study stops early: at the first round boundary after Ctrl-C (SIGINT) or SIGTERM, or after its
    time limit. A second signal stops at once (KeyboardInterrupt). Finished rounds are on disk by then."""

    def __init__(self, time_limit: float = 0.0) -> None:
        self.deadline = time.monotonic() + time_limit if time_limit > 0 else math.inf
        self.reason = ""

    def __call__(self) -> bool:
        if not self.reason and time.monotonic() >= self.deadline:
            self.reason = "time limit"
        return bool(self.reason)

    def request(self, reason: str) -> None:
        if self.reason == "interrupted":
            raise KeyboardInterrupt
        self.reason = "interrupted" if reason != "time limit" else reason

    @contextlib.contextmanager
    def on_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop at the next round boundary while inside (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: Any) -> None:
            if self.reason != "interrupted":
                print("\nstopping after this round (again to stop now)", file=sys.stderr, flush=True)
            self.request("interrupted")

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def run_study(
    cfg: StudyConfig, *, resume: bool = False, progress: bool = True, analysis: bool = True
) -> dict[str, Any]:
    """Run every (seed, configuration) of `cfg` and analyse; returns the summary (summary.json).

    Every finished round is appended to rounds.csv at once, so a study cut anywhere keeps it. A run cut
    short (Ctrl-C, the time limit, a crash) is run again from its first round by `resume`: its pool is
    gone with its server. `analysis` False (a part of a parallel study) writes rounds.csv only. Raises
    StudyBusy if another process is writing to the same folder."""
    cfg.validate()
    with study_lock(out_dir(cfg)):
        return _run_study(cfg, resume=resume, progress=progress, analysis=analysis)


def _run_study(cfg: StudyConfig, *, resume: bool, progress: bool, analysis: bool) -> dict[str, Any]:
    out = out_dir(cfg)
    if cfg.pilot_seeds:
        choice = run_pilot(cfg, resume=resume, progress=progress)
        if choice is None:
            return {"meta": {"pilot": f"stopped before its runs were complete; --resume continues it ({out / PILOT})"}}
        cfg = cfg.with_choice(choice)
    if cfg.parallel > 1 and len(cfg.configs) > 1:
        return run_parallel(cfg, resume=resume, progress=progress)
    import torch

    done = open_rounds(out, cfg, resume=resume)
    torch.set_num_threads(cfg.threads or cpu_threads())
    started = time.time()
    stop = Stop(cfg.time_limit)
    initial = initial_policies(cfg)
    evaluate_initial(cfg, initial, out)
    platform = Platform(
        root=Path(cfg.platform_root) if cfg.platform_root else DEFAULT_ROOT,
        catalogue=cfg.catalogue,
        log_dir=out / "logs",
        database_url=cfg.database_url,
    )
    timings = run_plan(cfg, platform, initial, done=done, out=out, stop=stop, progress=progress)
    if stop.reason:
        print(
            f"stopped ({stop.reason}) at a round boundary; every finished round is in {out / 'rounds.csv'}; "
            "--resume runs the cut run again and continues",
            file=sys.stderr,
        )
    meta = study_meta(cfg, out, started=started, timings=timings, resume=resume)
    if not analysis:
        (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        return {"meta": meta}
    return analyse_complete(out, cfg, meta)


def run_pilot(cfg: StudyConfig, *, resume: bool, progress: bool) -> str | None:
    """The pilot (StudyConfig.pilot_seeds, pilot_configs), run as a study of its own in OUT/pilot/ unless its
    choice is there already (choice.json); returns the configuration chosen, or None when it stopped before
    every one of its runs was complete. The rule, fixed before it runs: the highest mean held-out accuracy
    of the nodes' final policies over the pilot's seeds, nodes and datasets; the first listed on a tie."""
    folder = out_dir(cfg) / PILOT
    saved = _read_json(folder / CHOICE_FILE)
    if saved is not None:
        return str(saved["choice"])
    pilot = dataclasses.replace(
        cfg, seeds=list(cfg.pilot_seeds), configs=list(cfg.pilot_configs), pilot_seeds=[], pilot_configs=[]
    )
    pilot.out = str(folder)
    print(
        f"pilot: {', '.join(pilot.configs)} on seeds {', '.join(map(str, pilot.seeds))} (not counted), in {folder}",
        file=sys.stderr,
        flush=True,
    )
    run_study(pilot, resume=resume, progress=progress, analysis=False)
    rows = read_rounds(folder / "rounds.csv") if (folder / "rounds.csv").exists() else []
    complete = complete_runs(rows, pilot)
    if any((label, seed) not in complete for seed in pilot.seeds for label in pilot.configs):
        return None
    accuracy = pilot_accuracy(heldout.read_heldout(folder / HELDOUT_FILE), pilot.configs)
    choice = choose_pilot(accuracy, pilot.configs)
    (folder / CHOICE_FILE).write_text(
        json.dumps({"choice": choice, "rule": PILOT_RULE, "heldout_accuracy": accuracy}, indent=2) + "\n"
    )
    print(f"pilot chose {choice} (held-out accuracy {accuracy})", file=sys.stderr, flush=True)
    return choice


def pilot_accuracy(rows: list[dict[str, Any]], configs: list[str]) -> dict[str, float | None]:
    """Per configuration, the mean held-out accuracy of its runs' final policies (over seeds, nodes and
    datasets); None for one with no such row."""
    out: dict[str, float | None] = {}
    for label in configs:
        values = [r["accuracy"] for r in rows if r["stage"] == "after" and r["config"] == label]
        out[label] = round(sum(values) / len(values), 6) if values else None
    return out


def choose_pilot(accuracy: dict[str, float | None], configs: list[str]) -> str:
    """PILOT_RULE: the configuration of highest accuracy, the first listed on a tie."""
    scored = [label for label in configs if accuracy.get(label) is not None]
    if not scored:
        raise ValueError("the pilot has no held-out accuracy to choose by (give --heldout)")
    return max(scored, key=lambda label: (accuracy[label], -configs.index(label)))


def open_rounds(out: Path, cfg: StudyConfig, *, resume: bool) -> set[tuple[str, int]]:
    """Make `out` (study.json written) and return the (configuration, seed) runs rounds.csv already
    holds complete; the rows of a run cut short are dropped from it, to be run again. Without
    `resume` an existing rounds.csv is refused."""
    rounds_csv = out / "rounds.csv"
    if rounds_csv.exists() and not resume:
        raise FileExistsError(f"{rounds_csv} exists: give --resume to continue that study, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "study.json")
    if not (resume and rounds_csv.exists()):
        return set()
    rows = read_rounds(rounds_csv)
    done = complete_runs(rows, cfg)
    write_rounds(rounds_csv, [r for r in rows if (r["config"], r["seed"]) in done])
    heldout_csv = out / HELDOUT_FILE
    if heldout_csv.exists():
        heldout.write_heldout(heldout_csv, heldout.keep_rows(heldout.read_heldout(heldout_csv), done))
    return done


def evaluate_initial(cfg: StudyConfig, initial: dict[str, tuple[Any, Any]], out: Path) -> None:
    """The held-out "before" rows of each initial policy not yet in out/heldout.csv (cfg.heldout > 0)."""
    if not cfg.heldout:
        return
    done = heldout.evaluated_models(heldout.read_heldout(out / HELDOUT_FILE))
    for model, (policy, tokenizer) in initial.items():
        if model in done:
            continue
        print(f"held-out evaluation of {model} before training ({cfg.heldout} per dataset)", file=sys.stderr)
        rows = _evaluate(cfg, policy, tokenizer, stage="before", model=model)
        heldout.write_heldout(out / HELDOUT_FILE, rows, append=True)


def evaluate_final(cfg: StudyConfig, nodes: list[SwarmNode], out: Path, *, label: str, seed: int) -> None:
    """Every node's policy at the end of run (label, seed) on the held-out questions, to out/heldout.csv.

    On a CPU the policies are evaluated side by side, as many at once as torch's threads per operation
    fit in the cores (a study on one thread a node uses one core while its nodes play their rounds in
    turn). Each answer is the one a lone evaluation gives: greedy decoding, the same operations on the
    same thread count, and a tokenizer of its own per policy. A GPU evaluates them one after another."""
    import torch

    def one(node: SwarmNode) -> list[dict[str, Any]]:
        where = {"stage": "after", "model": node.config.model, "config": label, "seed": seed, "node": node.index}
        return _evaluate(cfg, node.node.model, copy.deepcopy(node.node.tokenizer), **where)

    on_cpu = all(next(node.node.model.parameters()).device.type == "cpu" for node in nodes)
    workers = max(1, min(len(nodes), cpu_threads() // torch.get_num_threads())) if on_cpu else 1
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="heldout") as pool:
        rows = [row for node_rows in pool.map(one, nodes) for row in node_rows]
    heldout.write_heldout(out / HELDOUT_FILE, rows, append=True)


def _evaluate(cfg: StudyConfig, policy: Any, tokenizer: Any, **where: Any) -> list[dict[str, Any]]:
    """heldout.csv's rows of one policy, labelled by `where` (heldout.heldout_rows' keywords: its model's
    name, stage, ...)."""
    scores = heldout.evaluate_policy(
        policy, tokenizer, cfg.task_catalogue(), n=cfg.heldout, max_new_tokens=cfg.max_new_tokens
    )
    return heldout.heldout_rows(scores, n=cfg.heldout, **where)


def initial_policies(cfg: StudyConfig) -> dict[str, tuple[Any, Any]]:
    """(model, tokenizer) of each model the study's nodes start from, loaded once: every run clones them."""
    from sapo_node.models import load_policy

    initial = {}
    for model in dict.fromkeys(cfg.node_models()):
        policy = load_policy(model, device=cfg.device, dtype=None if cfg.dtype == "auto" else cfg.dtype)
        initial[model] = policy[0], policy[1]
    return initial


def run_plan(
    cfg: StudyConfig,
    platform: Platform,
    initial: dict[str, tuple[Any, Any]],
    *,
    done: set[tuple[str, int]],
    out: Path,
    stop: Stop,
    progress: bool,
) -> list[dict[str, Any]]:
    """Every run not `done`, seed by seed, each round's rows appended to rounds.csv as it finishes, until
    `stop()`. Returns the seconds of each run that finished ({"config", "seed", "seconds"})."""
    rounds_csv = out / "rounds.csv"
    plan = [(seed, label, local, external) for seed in cfg.seeds for label, local, external in cfg.counts()]
    todo = [p for p in plan if (p[1], p[0]) not in done]
    timings: list[dict[str, Any]] = []
    runs_bar = progress_bar(
        total=len(plan),
        initial=len(plan) - len(todo),
        desc="runs",
        unit="run",
        position=0,
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )

    def keep(n: int, round_rows: list[dict[str, Any]]) -> None:
        write_rounds(rounds_csv, round_rows, append=True)

    try:
        with stop.on_signals(), platform.session([node_name(k) for k in range(1, cfg.nodes + 1)]):
            for seed, label, local, external in todo:
                if stop():
                    break
                runs_bar.set_description(f"runs ({label}, seed {seed})")
                run_started = time.time()
                rows = run_swarm(
                    cfg,
                    platform,
                    initial,
                    seed=seed,
                    label=label,
                    local=local,
                    external=external,
                    out=out,
                    progress=progress,
                    on_round=keep,
                    stop=stop,
                )
                free_memory()
                if len(rows) == cfg.nodes * cfg.rounds:
                    timings.append({"config": label, "seed": seed, "seconds": round(time.time() - run_started, 2)})
                    runs_bar.update(1)
    finally:
        runs_bar.close()
    return timings


def study_meta(
    cfg: StudyConfig, out: Path, *, started: float, timings: list[dict[str, Any]], resume: bool
) -> dict[str, Any]:
    """What the study ran on and how long it took (meta.json, summary.json's "meta"); a resumed study's
    run_seconds add to those of its earlier parts."""
    import torch

    meta = {
        "study": cfg.to_json(),
        "client": f"sapo-node/{__version__}",
        "torch_threads": torch.get_num_threads(),
        "machine": machine(cfg.device),
        "seconds": round(time.time() - started, 1),
        "run_seconds": timings,
    }
    prior = _previous_meta(out)
    if prior and resume:
        meta["run_seconds"] = prior.get("run_seconds", []) + timings
    return meta


def machine(device: str = "auto") -> str:
    """The machine a study ran on, for its summary: architecture, cores, and the GPU when one is used."""
    text = f"{_platform.machine()}, {cpu_threads()} cores"
    try:
        import torch

        if device != "cpu" and torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name(0)}"
    except Exception:  # no torch or no driver: the CPU description is the whole answer
        pass
    return text


def analyse_complete(out: Path, cfg: StudyConfig, meta: dict[str, Any]) -> dict[str, Any]:
    """The analysis of the complete runs in out/rounds.csv (a cut run's rounds stay in the file, outside the
    table); without any complete run, only the meta is written."""
    rows = read_rounds(out / "rounds.csv") if (out / "rounds.csv").exists() else []
    complete = complete_runs(rows, cfg)
    partial = sorted({(r["config"], r["seed"]) for r in rows} - complete)
    meta = {**meta, "partial_runs": [f"{label} seed {seed}" for label, seed in partial]}
    rows = [r for r in rows if (r["config"], r["seed"]) in complete]
    missing = [name for name in ("scipy", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:  # a GPU machine may carry only what the runs need: analyse rounds.csv elsewhere
        meta["analysis"] = f"not run here ({', '.join(missing)} not installed): python -m research --analyze DIR"
        print(meta["analysis"], file=sys.stderr)
    if not rows or missing:
        (out / "summary.json").write_text(json.dumps({"meta": meta}, indent=2) + "\n")
        return {"meta": meta}
    held = heldout.keep_rows(heldout.read_heldout(out / HELDOUT_FILE), complete)
    return analyse_study(cfg, rows, out, meta=meta, heldout=held)


def part_dir(out: Path, label: str) -> Path:
    """Where the process of configuration `label` of a parallel study keeps its rows."""
    return out / "parts" / label.replace("/", "-")


def run_parallel(cfg: StudyConfig, *, resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """The configurations side by side, `cfg.parallel` processes at a time, each a one-configuration study
    with its own server and pool in out/parts/<config>/; their rows are merged into out/rounds.csv."""
    out = out_dir(cfg)
    labels = list(cfg.configs)
    parts = {label: part_dir(out, label) for label in labels}
    if not resume and ((out / "rounds.csv").exists() or any((p / "rounds.csv").exists() for p in parts.values())):
        raise FileExistsError(f"{out} holds a study: give --resume to continue it, or another --out")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "study.json")
    (out / "logs").mkdir(exist_ok=True)
    started = time.time()
    stop = Stop(cfg.time_limit)
    waiting, running, told = list(labels), {}, set()
    total = len(cfg.seeds) * len(labels) * cfg.nodes * cfg.rounds
    bar = progress_bar(
        total=total,
        desc=f"{len(labels)} configurations, {cfg.parallel} at a time",
        unit="node-round",
        disable=not progress,
        dynamic_ncols=True,
        file=sys.stderr,
    )

    def rows_done() -> int:
        return sum(max(0, _line_count(p / "rounds.csv") - 1) for p in parts.values())

    try:
        with stop.on_signals():
            while waiting or running:
                while waiting and len(running) < cfg.parallel and not stop():
                    label = waiting.pop(0)
                    running[label] = _start_part(cfg, label, parts[label], out, resume, started)
                for label, proc in list(running.items()):
                    if proc.poll() is not None:
                        del running[label]
                        if proc.returncode != 0 and not stop.reason:
                            print(
                                f"configuration {label} exited with {proc.returncode}: see {out}/logs/", file=sys.stderr
                            )
                if stop.reason:
                    for label, proc in running.items():
                        if label not in told and proc.poll() is None:
                            proc.send_signal(signal.SIGINT)  # once: each stops at its next round boundary
                            told.add(label)
                    waiting.clear()
                if stop() and not running:
                    break
                bar.n = rows_done()
                bar.refresh()
                time.sleep(1.0)
    finally:
        bar.close()
        for proc in running.values():  # a second Ctrl-C: stop them now
            if proc.poll() is None:
                proc.kill()
    rows = [row for p in parts.values() if (p / "rounds.csv").exists() for row in read_rounds(p / "rounds.csv")]
    write_rounds(out / "rounds.csv", rows)
    held = [row for p in parts.values() for row in heldout.read_heldout(p / HELDOUT_FILE)]
    if held:  # each part evaluated the initial policies too: keep_rows keeps one of each
        heldout.write_heldout(out / HELDOUT_FILE, heldout.keep_rows(held, complete_runs(rows, cfg)))
    if stop.reason:
        print(
            f"stopped ({stop.reason}); every finished round is in {out}/rounds.csv; --resume continues", file=sys.stderr
        )
    part_meta = [_read_json(p / "meta.json") or {} for p in parts.values()]
    meta = {
        "study": cfg.to_json(),
        "client": f"sapo-node/{__version__}",
        "machine": machine(cfg.device),
        "seconds": round(time.time() - started, 1),
        "parallel": cfg.parallel,
        "torch_threads": next((m["torch_threads"] for m in part_meta if "torch_threads" in m), None),
        "run_seconds": [t for m in part_meta for t in m.get("run_seconds", [])],
    }
    return analyse_complete(out, cfg, meta)


def _start_part(cfg: StudyConfig, label: str, folder: Path, out: Path, resume: bool, started: float) -> Any:
    folder.mkdir(parents=True, exist_ok=True)
    left = cfg.time_limit - (time.time() - started) if cfg.time_limit else 0.0
    part = dataclasses.replace(
        cfg, configs=[label], out=str(folder), parallel=1, time_limit=max(left, 1.0) if left else 0
    )
    part.save(folder / "part.json")
    command = [sys.executable, "-m", "research.study", str(folder / "part.json")]
    if resume and (folder / "rounds.csv").exists():
        command.append("--resume")
    log = (out / "logs" / f"{folder.name}.log").open("a")
    # The harness is no installed package: the part finds it in this checkout whatever its working folder.
    pythonpath = os.pathsep.join(filter(None, (str(DEFAULT_ROOT), os.environ.get("PYTHONPATH"))))
    # A session of its own: a Ctrl-C in the terminal reaches the parent only, which passes it on once.
    return subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": pythonpath},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _line_count(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


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
    stop: Callable[[], bool] | None = None,
) -> list[dict[str, Any]]:
    """One run: a fresh pool, N nodes from their initial weights (`initial`: by model), R rounds round-robin.
    Returns one row per node per round (analysis.ROUND_FIELDS); fewer when `stop()` turned true after a round."""
    run_label = run_folder(label, seed)
    run_dir = out / "runs" / run_label
    if run_dir.exists():  # a run cut short: its outboxes hold groups of a pool that no longer exists
        shutil.rmtree(run_dir)
    rows: list[dict[str, Any]] = []
    with platform.run(run_label.replace("-", "_")) as url:
        nodes: list[SwarmNode] = []
        try:
            for k, model in enumerate(cfg.node_models(), start=1):
                token = platform.tokens[node_name(k)]
                config = node_config(cfg, url, token, model, run_dir / node_name(k), seed, k, label, local, external)
                nodes.append(start_node(k, config, initial[model], datasets=cfg.datasets))
                check_served_catalogue(nodes[-1].transport, cfg)
            bar = progress_bar(
                total=cfg.rounds,
                desc=f"{label} seed {seed}",
                unit="round",
                position=1,
                leave=False,
                disable=not progress,
                dynamic_ncols=True,
                file=sys.stderr,
            )
            try:
                for n in range(1, cfg.rounds + 1):
                    round_rows = play_round(
                        cfg, platform, nodes, label=label, local=local, external=external, seed=seed
                    )
                    rows.extend(round_rows)
                    if n == cfg.rounds and cfg.heldout:
                        # Before the last round's rows: a run is complete once its evaluation is on disk.
                        bar.set_description(f"{label} seed {seed}: held-out evaluation")
                        evaluate_final(cfg, nodes, out, label=label, seed=seed)
                    if on_round is not None:
                        on_round(n, round_rows)
                    mean = sum(r["reward_mean"] for r in round_rows) / len(round_rows)
                    bar.set_postfix(reward=f"{mean:.3f}", ext=sum(r["external_kept"] for r in round_rows))
                    bar.update(1)
                    if stop is not None and stop():
                        break
            finally:
                bar.close()
        finally:
            for node in nodes:
                node.close(cfg.flush_wait)
    return rows


def node_config(
    cfg: StudyConfig,
    url: str,
    token: str,
    model: str,
    folder: Path,
    seed: int,
    k: int,
    label: str,
    local: int,
    external: int,
) -> NodeConfig:
    """Node k's NodeConfig in the run of study seed `seed`: the study's settings, the configuration's I,
    J and options (presets.node_options), `folder` its run folder."""
    from sapo_node.config import NodeConfig

    return NodeConfig(
        server=url,
        token=token,
        model=model,
        device=cfg.device,
        dtype=cfg.dtype,
        out=str(folder),
        seed=node_seed(seed, k),
        rounds=cfg.rounds,
        questions=cfg.questions,
        generations=cfg.generations,
        local=local,
        external=external,
        catalogue=cfg.catalogue,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        lr=cfg.lr,
        micro_batch=cfg.micro_batch,
        checkpoint_every=0,
        connect_wait=cfg.connect_wait,
        flush_wait=cfg.flush_wait,
        # The study measures held-out accuracy itself (research.heldout), on its own schedule; the
        # site's live check would add greedy answers between rounds that no arm of another version had.
        no_heldout_check=True,
        **node_options(label),
    )


def start_node(k: int, config: NodeConfig, initial: tuple[Any, Any], datasets: Collection[str] = ()) -> SwarmNode:
    """Node k (a SwarmNode) on a copy of its initial weights, its transport connected to `config.server`
    and its outbox in its run folder, drawing from `datasets` of the catalogue (empty: all). The transport
    keeps J external groups at most."""
    from research.swarm import SwarmNode, clone_policy
    from sapo_node.transport import OUTBOX_FILE
    from sapo_node.transport.websocket import WebSocketTransport

    folder = Path(config.out)
    folder.mkdir(parents=True, exist_ok=True)
    transport = WebSocketTransport(
        config.server,
        config.token,
        folder / OUTBOX_FILE,
        buffer_size=config.external,
        max_buffer_size=config.external,
        poll_interval=POLL_INTERVAL,
    )
    return SwarmNode.start(k, config, transport, clone_policy(initial), datasets)


def check_served_catalogue(transport: WebSocketTransport, cfg: StudyConfig) -> None:
    """The server's default swarm serves it (named after the swarm and its version): same tasks."""
    served = transport.catalogue()
    if served is None or served.tasks != CATALOGUES[cfg.catalogue].tasks:
        raise RuntimeError(f"the server does not serve catalogue {cfg.catalogue!r}")


def play_round(
    cfg: StudyConfig, platform: Platform, nodes: list[SwarmNode], *, label: str, local: int, external: int, seed: int
) -> list[dict[str, Any]]:
    """One round, node after node: each takes its step, and its turn ends when the server has its shares
    (the next nodes may sample them). Returns a rounds.csv row per node."""
    round_rows = []
    for node in nodes:
        row = node.step()
        wait_acknowledged(cfg, platform, node)
        round_rows.append(_csv_row(row, label=label, local=local, external=external, seed=seed, node=node.index))
    return round_rows


def wait_acknowledged(cfg: StudyConfig, platform: Platform, node: SwarmNode) -> None:
    """Wait until the server has acknowledged the node's shares. A busy machine can hold an
    acknowledgement back for minutes: each `flush_wait` seconds without one is a line on stderr and the
    wait goes on, for as long as the run's server process lives (the transport reconnects and resends
    meanwhile). Raises PlatformError when the server has exited."""
    waited = 0.0
    while not node.transport.flush(cfg.flush_wait):
        waited += cfg.flush_wait
        if not platform.serving():
            raise PlatformError(
                f"the server exited before acknowledging node {node.index}'s shares; see {platform.log_dir}"
            )
        print(
            f"the server has not acknowledged node {node.index}'s shares after {waited:.0f} s "
            f"({node.transport.status}); waiting",
            file=sys.stderr,
            flush=True,
        )


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


def main(argv: list[str] | None = None) -> int:
    """One part of a parallel study: `python -m research.study PART_JSON [--resume]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m research.study")
    parser.add_argument("config", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    cfg = StudyConfig(**json.loads(args.config.read_text()))
    run_study(cfg, resume=args.resume, progress=False, analysis=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
