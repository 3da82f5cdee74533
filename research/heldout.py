"""Held-out accuracy of a study's nodes, before and after: what the export's card reports for one run.

Each model the nodes start from is evaluated once before the runs, and every node's final policy at
the end of its run: questions 0..n-1 of every dataset of the catalogue at the held-out dataset seed
(sapo_node.tiny.evaluation.EVAL_SEED; the nodes train on their own seeds), answered greedily with the node's
prompt, scored by the verifier the node and the server share. Rows go to heldout.csv (one per
policy and dataset); the analysis compares each configuration with the silo seed by seed, as the
primary endpoint does with cumulative reward.
"""

from __future__ import annotations

import csv
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from research.endpoints import paired_points

#: The columns of heldout.csv. stage "before": a model's initial policy (config empty, seed and
#: node 0); "after": node `node`'s final policy in run (config, seed).
HELDOUT_FIELDS = ("stage", "config", "seed", "node", "model", "dataset", "n", "accuracy", "parsed", "seconds")
_INTS = {"seed", "node", "n"}
_FLOATS = {"accuracy", "parsed", "seconds"}

#: Where a study keeps its held-out evaluations.
HELDOUT_FILE = "heldout.csv"

#: Prompts per generation batch: bounds the key/value cache (SmolLM2: about 0.6 GB for 50 rows).
EVAL_BATCH = 50


def evaluate_policy(
    model: Any, tokenizer: Any, catalogue: Any, *, n: int, max_new_tokens: int
) -> dict[str, dict[str, float]]:
    """{dataset: {"accuracy", "parsed", "seconds"}}: greedy answers to n held-out questions per dataset."""
    from sapo_node.tasks import extract_answer, score_completion
    from sapo_node.tiny.evaluation import EVAL_SEED, heldout_answers

    out = {}
    for spec in catalogue.tasks:
        started = time.perf_counter()
        entries, texts = heldout_answers(model, tokenizer, spec, n=n, max_new_tokens=max_new_tokens, batch=EVAL_BATCH)
        scores = [score_completion(spec, EVAL_SEED, e, t) for e, t in zip(entries, texts, strict=True)]
        out[spec.dataset] = {
            "accuracy": sum(scores) / n,
            "parsed": sum(extract_answer(t) is not None for t in texts) / n,
            "seconds": time.perf_counter() - started,
        }
    return out


def heldout_rows(
    scores: dict[str, dict[str, float]],
    *,
    stage: str,
    model: str,
    n: int,
    config: str = "",
    seed: int = 0,
    node: int = 0,
) -> list[dict[str, Any]]:
    return [
        {
            "stage": stage,
            "config": config,
            "seed": seed,
            "node": node,
            "model": model,
            "dataset": dataset,
            "n": n,
            "accuracy": round(s["accuracy"], 6),
            "parsed": round(s["parsed"], 6),
            "seconds": round(s["seconds"], 2),
        }
        for dataset, s in scores.items()
    ]


def write_heldout(path: Path, rows: Iterable[dict[str, Any]], *, append: bool = False) -> None:
    new = not (append and path.exists())
    with path.open("w" if new else "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=HELDOUT_FIELDS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def read_heldout(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        for name in _INTS:
            row[name] = int(row[name])
        for name in _FLOATS:
            row[name] = float(row[name])
    return rows


def keep_rows(rows: Sequence[dict[str, Any]], complete: set[tuple[str, int]]) -> list[dict[str, Any]]:
    """The "before" rows (each once) and the "after" rows of complete (config, seed) runs."""
    kept: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row["stage"] == "before" or (row["config"], row["seed"]) in complete:
            kept.setdefault((row["stage"], row["config"], row["seed"], row["node"], row["model"], row["dataset"]), row)
    return list(kept.values())


def evaluated_models(rows: Sequence[dict[str, Any]]) -> set[str]:
    return {row["model"] for row in rows if row["stage"] == "before"}


def summarise(rows: Sequence[dict[str, Any]], baseline: str | None, order: Sequence[str]) -> dict[str, Any]:
    """Mean accuracy and parsed share before (per model) and after (per configuration and seed, over its
    nodes and the datasets), per dataset, and each configuration's paired difference from the silo in
    accuracy points, seed by seed (mean, 95% t interval, seeds gaining, two-sided Wilcoxon p)."""
    before = [r for r in rows if r["stage"] == "before"]
    after = [r for r in rows if r["stage"] == "after"]
    result: dict[str, Any] = {
        "n": sorted({r["n"] for r in rows}),
        "before": _means(before, lambda r: r["model"]),
        "runs": {},
        "datasets": {"before": _means(before, lambda r: r["dataset"])},
        "paired": {},
    }
    by_run = _means(after, lambda r: (r["config"], r["seed"]))
    for config in order:
        runs = {seed: value for (c, seed), value in sorted(by_run.items()) if c == config}
        if runs:
            result["runs"][config] = runs
    for config in result["runs"]:
        result["datasets"][config] = _means([r for r in after if r["config"] == config], lambda r: r["dataset"])
    if baseline in result["runs"]:
        silo = result["runs"][baseline]
        for config, runs in result["runs"].items():
            seeds = sorted(set(runs) & set(silo))
            if config == baseline or not seeds:
                continue
            result["paired"][config] = paired_points(
                [runs[s]["accuracy"] for s in seeds], [silo[s]["accuracy"] for s in seeds], seeds
            )
    return result


def _means(rows: Sequence[dict[str, Any]], key: Any) -> dict[Any, dict[str, float]]:
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return {
        k: {
            "accuracy": float(np.mean([r["accuracy"] for r in g])),
            "parsed": float(np.mean([r["parsed"] for r in g])),
            "policies": len({(r["config"], r["seed"], r["node"], r["model"]) for r in g}),
        }
        for k, g in sorted(groups.items(), key=lambda kv: str(kv[0]))
    }


def markdown(result: dict[str, Any]) -> str:
    """The held-out tables of endpoints.md."""
    n = "/".join(str(x) for x in result["n"])
    lines = [
        f"Held-out accuracy, greedy, {n} questions per dataset (dataset seed held out from training): the "
        "initial policy, then each run's nodes at its end (mean over the nodes and the datasets; parsed share "
        "in brackets)",
        "",
    ]
    seeds = sorted({s for runs in result["runs"].values() for s in runs})
    lines += ["| policy | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for model, v in result["before"].items():
        cells = [f"{v['accuracy']:.3f} ({v['parsed']:.2f})"] * len(seeds)
        lines.append(f"| before ({model}) | " + " | ".join(cells) + " |")
    for config, runs in result["runs"].items():
        cells = [f"{runs[s]['accuracy']:.3f} ({runs[s]['parsed']:.2f})" if s in runs else "" for s in seeds]
        lines.append(f"| after {config} | " + " | ".join(cells) + " |")
    datasets = sorted({d for per in result["datasets"].values() for d in per})
    lines += [
        "",
        "Held-out accuracy per dataset (mean over seeds and nodes; parsed share in brackets)",
        "",
        "| policy | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    for stage, per in result["datasets"].items():
        label = "before" if stage == "before" else f"after {stage}"
        cells = [f"{per[d]['accuracy']:.3f} ({per[d]['parsed']:.2f})" if d in per else "" for d in datasets]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if result["paired"]:
        lines += [
            "",
            "Held-out accuracy after, paired difference from the silo, seed by seed (accuracy points)",
            "",
            "| config | seeds | per seed | mean | sd | 95% CI | seeds gaining | Wilcoxon p (two-sided) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for config, p in result["paired"].items():
            ci = f"{p['ci95_points'][0]:+.1f} .. {p['ci95_points'][1]:+.1f}" if p["ci95_points"] else ""
            pval = f"{p['wilcoxon_p']:.3g}" if p["wilcoxon_p"] is not None else ""
            per_seed = ", ".join(f"{d:+.1f}" for d in p["diff_points"])
            sd = f"{p['sd_points']:.1f}" if p.get("sd_points") is not None else ""
            lines.append(
                f"| {config} | {len(p['seeds'])} | {per_seed} | {p['mean_points']:+.1f} | {sd} | {ci} | "
                f"{p['seeds_gaining']}/{len(p['seeds'])} | {pval} |"
            )
    return "\n".join(lines) + "\n"
