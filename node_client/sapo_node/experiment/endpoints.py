"""The study's pre-registered endpoints and the questions beside the paper's table.

- **Learning check**: does a node learn at all? Per configuration and seed, the nodes' mean reward
  over the last `span` rounds against the first `span` (cpu-learn's bar: >= 1.5x for the silo).
- **Primary endpoint** (fixed in docs/experiment.md before the study ran): the paired gain in
  cumulative reward of a swarm configuration over the silo, seed by seed (same seed = same initial
  weights and question streams); its mean with a 95% t interval, the two-sided Wilcoxon
  signed-rank test of the per-seed differences, and how many seeds gained.
- **Per-dataset reward** per node (skill transfer): each node's mean reward on each dataset, from
  the per-question rewards in rounds.csv, over the first and the last `span` rounds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from sapo_node.experiment.runs import baseline_config, config_order, cumulative_by_run


def _span(rows: Sequence[dict[str, Any]], span: int) -> tuple[int, int]:
    last = max(row["round"] for row in rows)
    span = max(1, min(span, last // 2))
    return span, last


def learning(rows: Sequence[dict[str, Any]], span: int = 20) -> dict[str, dict[int, dict[str, float]]]:
    """{config: {seed: {first, last, ratio}}}: mean reward over nodes in the first and last `span` rounds."""
    span, last = _span(rows, span)
    acc: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for row in rows:
        if row["round"] <= span:
            acc[(row["config"], row["seed"], "first")].append(row["reward_mean"])
        if row["round"] > last - span:
            acc[(row["config"], row["seed"], "last")].append(row["reward_mean"])
    out: dict[str, dict[int, dict[str, float]]] = {}
    for config in config_order(rows):  # the silo first
        for seed in sorted({s for c, s, _ in acc if c == config}):
            first, final = float(np.mean(acc[(config, seed, "first")])), float(np.mean(acc[(config, seed, "last")]))
            ratio = final / first if first > 0 else float("inf")
            out.setdefault(config, {})[seed] = {"first": first, "last": final, "ratio": ratio}
    return out


def paired_endpoint(rows: Sequence[dict[str, Any]], config: str, baseline: str | None = None) -> dict[str, Any] | None:
    """The paired cumulative-reward gain of `config` over the silo across seeds, or None without both."""
    from scipy import stats

    totals = cumulative_by_run(rows)
    baseline = baseline or baseline_config(rows)
    if baseline is None or config not in totals or baseline not in totals:
        return None
    seeds = sorted(set(totals[config]) & set(totals[baseline]))
    if not seeds:
        return None
    diff = np.array([totals[config][s] - totals[baseline][s] for s in seeds])
    gain = np.array([100.0 * (totals[config][s] / totals[baseline][s] - 1.0) for s in seeds])
    result: dict[str, Any] = {
        "config": config, "baseline": baseline, "seeds": seeds,
        "gain_pct": {s: float(g) for s, g in zip(seeds, gain, strict=True)},
        "gain_pct_mean": float(gain.mean()), "seeds_gaining": int((diff > 0).sum()),
        "ci95_pct": None, "wilcoxon_p": None,
    }  # fmt: skip
    if len(seeds) >= 2:
        half = float(stats.t.ppf(0.975, len(seeds) - 1) * gain.std(ddof=1) / np.sqrt(len(seeds)))
        result["ci95_pct"] = [float(gain.mean()) - half, float(gain.mean()) + half]
        if np.any(diff != 0):
            result["wilcoxon_p"] = float(stats.wilcoxon(diff, alternative="two-sided").pvalue)
    return result


def dataset_rewards(
    rows: Sequence[dict[str, Any]], span: int = 20
) -> dict[str, dict[int, dict[str, dict[str, float]]]]:
    """{config: {node: {dataset: {first, last, all}}}}: mean reward of the node's questions of that
    dataset (over seeds) in the first `span` rounds, the last `span` and the whole run."""
    span, last = _span(rows, span)
    acc: dict[tuple[str, int, str, str], list[float]] = defaultdict(list)
    for row in rows:
        if not row.get("question_rewards"):
            continue
        refs = row["questions"].split(";")
        rewards = [float(x) for x in row["question_rewards"].split(";")]
        for ref, reward in zip(refs, rewards, strict=True):
            dataset = ref.split("/")[0]
            acc[(row["config"], row["node"], dataset, "all")].append(reward)
            if row["round"] <= span:
                acc[(row["config"], row["node"], dataset, "first")].append(reward)
            if row["round"] > last - span:
                acc[(row["config"], row["node"], dataset, "last")].append(reward)
    out: dict[str, dict[int, dict[str, dict[str, float]]]] = {}
    for config in config_order(rows):
        for (c, node, dataset, part), values in sorted(acc.items()):
            if c == config:
                out.setdefault(config, {}).setdefault(node, {}).setdefault(dataset, {})[part] = float(np.mean(values))
    return out


def endpoints(rows: Sequence[dict[str, Any]], span: int = 20) -> dict[str, Any]:
    base = baseline_config(rows)
    return {
        "learning_span": _span(rows, span)[0],
        "learning": learning(rows, span),
        "paired": {c: paired_endpoint(rows, c, base) for c in config_order(rows) if c != base} if base else {},
        "dataset_rewards": dataset_rewards(rows, span),
    }


def endpoints_markdown(result: dict[str, Any]) -> str:
    """Tables of the learning check, the paired gains and (when recorded) the per-dataset rewards."""
    span = result["learning_span"]
    lines = [f"Learning: mean reward over the nodes, first {span} rounds -> last {span} (ratio)", ""]
    seeds = sorted({s for runs in result["learning"].values() for s in runs})
    lines += ["| config | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for config, runs in result["learning"].items():
        cells = [
            f"{runs[s]['first']:.3f} -> {runs[s]['last']:.3f} ({runs[s]['ratio']:.2f}x)" if s in runs else ""
            for s in seeds
        ]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    if result["paired"]:
        lines += ["", "Paired cumulative-reward gain over the silo, seed by seed", "",
                  "| config | seeds | mean gain | 95% CI | seeds gaining | Wilcoxon p (two-sided) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for config, p in result["paired"].items():
            if p is None:
                continue
            ci = f"{p['ci95_pct'][0]:+.1f}% .. {p['ci95_pct'][1]:+.1f}%" if p["ci95_pct"] else ""
            pval = f"{p['wilcoxon_p']:.3g}" if p["wilcoxon_p"] is not None else ""
            lines.append(f"| {config} | {len(p['seeds'])} | {p['gain_pct_mean']:+.1f}% | {ci} | "
                         f"{p['seeds_gaining']}/{len(p['seeds'])} | {pval} |")  # fmt: skip
    if result["dataset_rewards"]:
        lines += ["", f"Reward per node and dataset (mean over seeds): first {span} rounds -> last {span}", ""]
        datasets = sorted({d for nodes in result["dataset_rewards"].values() for ds in nodes.values() for d in ds})
        lines += ["| config | node | " + " | ".join(datasets) + " |", "|---|---|" + "---|" * len(datasets)]
        for config, nodes in result["dataset_rewards"].items():
            for node, ds in sorted(nodes.items()):
                cells = [
                    f"{ds[d].get('first', float('nan')):.2f} -> {ds[d].get('last', float('nan')):.2f}"
                    if d in ds
                    else ""
                    for d in datasets
                ]
                lines.append(f"| {config} | {node} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
