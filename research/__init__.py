"""The research harness: the SAPO paper's controlled experiment against the real platform.

    .venv/bin/python -m research --preset smoke                  # every moving part, < 2 minutes
    .venv/bin/python -m research --preset cpu-tiny               # the study on 2 CPU cores, < 1 hour
    .venv/bin/python -m research --preset gpu-qwen               # the paper's settings, on a GPU
    .venv/bin/python -m research --analyze results/cpu-tiny      # redo the table and plots from rounds.csv
    .venv/bin/python -m research --merge results/b --out results/a   # runs played elsewhere, into one study

Run from the repository root: the harness starts the platform from this checkout, so it lives beside
platform/ and bench/, not in the node client's package, and imports only sapo_node's public pieces
(nothing in sapo_node or the platform imports it). Importing this module stays cheap: torch, numpy
and matplotlib load only when a study or an analysis runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

from research.presets import PRESETS, StudyConfig, preset

#: How a user runs it, in its usage line and its errors.
PROG = "python -m research"

DESCRIPTION = """\
Runs a swarm of N nodes for R rounds for each local/external configuration (default 8/0, 6/2, 4/4,
2/6: groups out of 8, scaled to B when B < 8), once per seed, every configuration with the same
seeds (same initial weights, same question stream for node k). The nodes share through the REAL
platform: a fresh pool (PostgreSQL database) and a daphne server of the /ws/node/ endpoint per
run, started from the repository checkout -- so this command needs the SAPO Swarm checkout
(--platform-root, default: the one containing this package) with the platform's requirements
installed; the node client package alone has no server. PostgreSQL: --database-url or
DATABASE_URL (a server where CREATE DATABASE is allowed), else the platform's embedded one.
All nodes of a run live in this one process and take turns (node 1 round r, node 2 round r, ...):
a synchronous schedule of asynchronous nodes, each with its own WebSocket to the server.
Writes rounds.csv, table.csv/.md, rewards.png, significance.csv/.png and summary.json to --out."""

#: Fields with a list value, given on the command line comma-separated.
LIST_FIELDS = {
    "seeds": int,
    "configs": str,
    "cost_levels": float,
    "datasets": str,
    "pilot_seeds": int,
    "pilot_configs": str,
}


def add_flags(parser: argparse.ArgumentParser) -> None:
    docs = _study_docs()
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="cpu-tiny",
        help="starting values of every setting below (default: cpu-tiny)",
    )
    for f in dataclasses.fields(StudyConfig):
        if f.name == "preset":
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name in LIST_FIELDS:
            kind: Any = _comma_list(LIST_FIELDS[f.name])
        elif f.type in ("int",):
            kind = int
        elif f.type in ("float", "float | None"):
            kind = float
        else:
            kind = str
        parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS, help=docs.get(f.name, ""))
    parser.add_argument("--resume", action="store_true", help="continue the study in --out, skipping complete runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--analyze",
        metavar="DIR[,DIR...]",
        help="only redo the analysis of DIR/rounds.csv (no runs); several DIRs are analysed together, "
        "written to --out (default: the first DIR)",
    )
    parser.add_argument(
        "--merge",
        metavar="DIR[,DIR...]",
        help="only copy the complete runs of the studies in DIR (run elsewhere with other --seeds or --configs) "
        "into the study in --out; nothing is run or analysed",
    )
    parser.add_argument(
        "--publish",
        metavar="DIR",
        help="then copy table.md/.csv, the PNGs and summary.json to DIR (e.g. docs/experiment)",
    )


def _comma_list(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        return [kind(x.strip()) for x in text.split(",") if x.strip()]

    return parse


def _study_docs() -> dict[str, str]:
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(StudyConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, following in zip(body, body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(following, ast.Expr):
            value = getattr(following, "value", None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs[stmt.target.id] = " ".join(value.value.split())  # type: ignore[attr-defined]
    return docs


def study_config(args: argparse.Namespace) -> StudyConfig:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(StudyConfig) if hasattr(args, f.name)}
    given.pop("preset", None)
    return preset(args.preset, **given)


def saved_study_config(folder: Path, args: argparse.Namespace) -> StudyConfig:
    """The config saved beside a study's rounds.csv (study.json), with the flags given now on top."""
    saved = folder / "study.json"
    if not saved.exists():
        return study_config(args)
    names = {f.name for f in dataclasses.fields(StudyConfig)}
    given = {k: getattr(args, k) for k in names if hasattr(args, k) and k != "preset"}
    return dataclasses.replace(StudyConfig.load(saved), **given)


PUBLISHED = (
    "table.md",
    "table.csv",
    "endpoints.md",
    "rewards.png",
    "significance.png",
    "significance.csv",
    "summary.json",
)


def experiment_command(args: argparse.Namespace) -> int:
    if args.merge:
        return merge_command(args)
    if args.analyze:
        from research import heldout
        from research.analysis import analyse_study, read_rounds, write_rounds

        folders = [Path(f) for f in args.analyze.split(",") if f]
        folder = folders[0]
        cfg = saved_study_config(folder, args)
        rows = [row for f in folders for row in read_rounds(f / "rounds.csv")]
        if hasattr(args, "seeds"):  # only the seeds (and configurations) asked for
            rows = [row for row in rows if row["seed"] in args.seeds]
        if hasattr(args, "configs"):
            rows = [row for row in rows if row["config"] in args.configs]
        out = folder
        if len(folders) > 1 or hasattr(args, "seeds") or hasattr(args, "configs"):
            # A merged or filtered analysis writes its own rounds.csv: never over a study's own.
            if not getattr(args, "out", "") or Path(args.out).resolve() in {f.resolve() for f in folders}:
                print(f"{PROG}: error: a merged or filtered --analyze needs another --out", file=sys.stderr)
                return 2
            out = Path(args.out)
        runs = {(row["config"], row["seed"]) for row in rows}
        held = heldout.keep_rows([r for f in folders for r in heldout.read_heldout(f / heldout.HELDOUT_FILE)], runs)
        if out != folder:
            out.mkdir(parents=True, exist_ok=True)
            write_rounds(out / "rounds.csv", rows)
            if held:
                heldout.write_heldout(out / heldout.HELDOUT_FILE, held)
        meta = _saved_meta(folder)
        if (folder / "study.json").exists():
            # The summary a study process left names that process's settings: a study resumed with other
            # --seeds, or with runs merged in from another folder, is the one its study.json plans.
            meta = {**meta, "study": cfg.to_json()}
        if out != folder:
            meta = {"analysed_from": [str(f) for f in folders], **meta}
        summary = analyse_study(cfg, rows, out, meta=meta, heldout=held)
    else:
        from research.lock import StudyBusy
        from research.study import out_dir, run_study

        try:
            cfg = study_config(args)
        except ValueError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        print(
            f"study ({cfg.preset}): {len(cfg.seeds)} seeds x {len(cfg.configs)} configurations "
            f"{', '.join(f'{c} as {i}/{j}' for c, i, j in cfg.counts())}; {cfg.nodes} nodes x {cfg.rounds} rounds, "
            f"B={cfg.questions}, G={cfg.generations}, model {cfg.model}"
            + (
                f"; first a pilot of {', '.join(cfg.pilot_configs)} on seeds "
                f"{', '.join(map(str, cfg.pilot_seeds))} chooses the configuration in place of 'pilot'"
                if cfg.pilot_seeds
                else ""
            ),
            flush=True,
        )
        try:
            summary = run_study(cfg, resume=args.resume, progress=not args.no_progress)
        except KeyboardInterrupt:
            print(
                f"{PROG}: stopped; the finished rounds are in rounds.csv (--resume continues)",
                file=sys.stderr,
            )
            return 130
        except (FileExistsError, StudyBusy) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        out = out_dir(cfg)
        if "table" not in summary:
            print(f"no complete run yet: rows in {out}/rounds.csv ({summary['meta'].get('seconds', '?')} s)")
            return 0
    print((out / "table.md").read_text())
    print((out / "endpoints.md").read_text())
    print(f"results in {out}/ ({summary['meta'].get('seconds', '?')} s)")
    if args.publish:
        target = Path(args.publish)
        target.mkdir(parents=True, exist_ok=True)
        for name in PUBLISHED:
            shutil.copy2(out / name, target / name)
        print(f"published {', '.join(PUBLISHED)} to {target}/")
    return 0


def merge_command(args: argparse.Namespace) -> int:
    from research.lock import StudyBusy
    from research.merge import MergeError, merge_studies

    if not getattr(args, "out", ""):
        print(f"{PROG}: error: --merge needs --out, the study to merge into", file=sys.stderr)
        return 2
    target = Path(args.out)
    sources = [Path(f) for f in args.merge.split(",") if f]
    try:
        merged = merge_studies(target, sources)
    except (MergeError, StudyBusy) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(f"{config} seed {seed}" for config, seed in merged.runs) or "none (no complete run to take)"
    print(f"merged into {target}: {names}")
    missing = [f"{config} seed {seed}" for config, seed in merged.planned if (config, seed) not in merged.complete]
    print(
        f"{target} holds {len(merged.complete)} complete runs"
        + (f"; not yet run of its study.json's plan: {', '.join(missing)}" if missing else "")
        + f"; `{PROG} --analyze {target}` redoes its analysis"
    )
    return 0


def _saved_meta(folder: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((folder / "summary.json").read_text()).get("meta", {})
    except (OSError, ValueError):
        study = folder / "study.json"
        return {"study": json.loads(study.read_text())} if study.exists() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_flags(parser)
    args = parser.parse_args(argv)
    return experiment_command(args)
