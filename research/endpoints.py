"""The study's pre-registered endpoints and the questions beside the paper's table.

- **Learning check**: does a node learn at all? Per configuration and seed, the nodes' mean reward
  over the last `span` rounds against the first `span` (cpu-learn's bar: >= 1.5x for the silo).
- **Primary endpoint** (fixed in docs/experiment.md before the study ran): the paired gain in
  cumulative reward of a swarm configuration over the silo, seed by seed (same seed = same initial
  weights and question streams); its mean with a 95% t interval, the two-sided Wilcoxon
  signed-rank test of the per-seed differences, and how many seeds gained.
- **Per-dataset reward** per node (skill transfer): each node's mean reward on each dataset, from
  the per-question rewards in rounds.csv, over the first and the last `span` rounds.
- **Generation cost** (sharing's promise: the same reward for fewer rollouts): per run, the
  completions its nodes generated up to the first round where the trailing `window`-round moving
  average of their mean reward reached each of the study's `cost_levels`.
- **Learning zone**: per run, the share of the nodes' own groups whose mean reward lies strictly
  between 0 and 1 (informative to GRPO), and its paired difference from the silo in points.
- **Transfer** (when nodes start from built-in warm starts that know different datasets, e.g.
  tiny-learn-a and tiny-learn-b): per run, the nodes' mean reward on the questions of datasets their
  own warm start does not know (the tasks they could not do alone), over the whole run and the last
  `span` rounds, and its paired gain over the silo seed by seed (Wilcoxon as above).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from research.runs import (
    baseline_config,
    config_order,
    cumulative_by_run,
    moving_average,
    t_interval,
    wilcoxon_p,
)


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
        "config": config,
        "baseline": baseline,
        "seeds": seeds,
        "gain_pct": {s: float(g) for s, g in zip(seeds, gain, strict=True)},
        "gain_pct_mean": float(gain.mean()),
        "gain_pct_sd": float(gain.std(ddof=1)) if len(gain) > 1 else None,
        "seeds_gaining": int((diff > 0).sum()),
        "ci95_pct": None,
        "wilcoxon_p": None,
    }
    result["ci95_pct"] = t_interval(gain)
    result["wilcoxon_p"] = wilcoxon_p(diff)
    return result


def _question_rewards(rows: Sequence[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str, float]]:
    """(row, dataset, reward) for every question of every row that recorded per-question rewards."""
    for row in rows:
        if not row.get("question_rewards"):
            continue
        refs = row["questions"].split(";")
        rewards = [float(x) for x in row["question_rewards"].split(";")]
        for ref, reward in zip(refs, rewards, strict=True):
            yield row, ref.split("/")[0], reward


def dataset_rewards(
    rows: Sequence[dict[str, Any]], span: int = 20
) -> dict[str, dict[int, dict[str, dict[str, float]]]]:
    """{config: {node: {dataset: {first, last, all}}}}: mean reward of the node's questions of that
    dataset (over seeds) in the first `span` rounds, the last `span` and the whole run."""
    span, last = _span(rows, span)
    acc: dict[tuple[str, int, str, str], list[float]] = defaultdict(list)
    for row, dataset, reward in _question_rewards(rows):
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


def node_known(meta: dict[str, Any] | None) -> dict[int, frozenset[str]]:
    """Node k -> the datasets its built-in warm start knows, for the nodes whose model (from the
    study's settings in `meta`) is a tiny variant that knows a subset of its catalogue."""
    from research.presets import StudyConfig
    from sapo_node.tiny.variants import get_variant

    study = (meta or {}).get("study") or {}
    if not str(study.get("model", "")).strip(" ,"):
        return {}
    names = {f.name for f in dataclasses.fields(StudyConfig)}
    cfg = StudyConfig(**{k: v for k, v in study.items() if k in names})  # an older study's extra keys dropped
    out: dict[int, frozenset[str]] = {}
    for k, model in enumerate(cfg.node_models(), start=1):
        try:
            variant = get_variant(model)
        except ValueError:  # not a built-in tiny variant
            continue
        if variant.known:
            out[k] = frozenset(variant.known)
    return out


def transfer(
    rows: Sequence[dict[str, Any]], known: dict[int, frozenset[str]], span: int = 20
) -> dict[str, dict[str, Any]]:
    """{config: {"runs": {seed: {all, last}}, "paired": ...}}: the nodes' mean reward on questions of
    datasets their warm start does not know, per run; the paired gain (whole run) over the silo."""
    span, last = _span(rows, span)
    acc: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    for row, dataset, reward in _question_rewards(rows):
        mine = known.get(row["node"])
        if mine is None or dataset in mine:
            continue
        acc[(row["config"], row["seed"], "all")].append(reward)
        if row["round"] > last - span:
            acc[(row["config"], row["seed"], "last")].append(reward)
    runs: dict[str, dict[int, dict[str, float]]] = {}
    for (config, seed, part), values in acc.items():
        runs.setdefault(config, {}).setdefault(seed, {})[part] = float(np.mean(values))
    base = baseline_config(rows)
    out: dict[str, dict[str, Any]] = {}
    for config in config_order(rows):
        if config not in runs:
            continue
        entry: dict[str, Any] = {"runs": dict(sorted(runs[config].items())), "paired": None}
        if base is not None and config != base and base in runs:
            seeds = sorted(set(runs[config]) & set(runs[base]))
            a = np.array([runs[config][s]["all"] for s in seeds])
            b = np.array([runs[base][s]["all"] for s in seeds])
            paired: dict[str, Any] = {
                "seeds": seeds,
                "seeds_gaining": int((a > b).sum()),
                "gain_pct_of_means": float(100.0 * (a.mean() / b.mean() - 1.0)) if b.mean() > 0 else None,
                "wilcoxon_p": None,
            }
            if len(seeds) >= 2:
                paired["wilcoxon_p"] = wilcoxon_p(a - b)
            entry["paired"] = paired
        out[config] = entry
    return out


def learning_zone(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """{"runs": {config: {seed: share}}, "paired": {config: ...}}: per run, the share of its nodes' own groups
    in the learning zone, those whose mean reward lies strictly between 0 and 1 (some completions right,
    some not: the groups GRPO learns from), from the per-question rewards in rounds.csv; and each
    configuration's paired difference from the silo in points, seed by seed (mean, sd, 95% t interval,
    seeds gaining, two-sided Wilcoxon p)."""
    acc: dict[tuple[str, int], list[float]] = defaultdict(list)
    for row, _dataset, reward in _question_rewards(rows):
        acc[(row["config"], row["seed"])].append(1.0 if 1e-6 < reward < 1.0 - 1e-6 else 0.0)
    runs: dict[str, dict[int, float]] = {}
    for config in config_order(rows):
        seeds = sorted(s for c, s in acc if c == config)
        if seeds:
            runs[config] = {s: float(np.mean(acc[(config, s)])) for s in seeds}
    base = baseline_config(rows)
    paired = {}
    for config, by_seed in runs.items():
        if base is None or config == base or base not in runs:
            continue
        seeds = sorted(set(by_seed) & set(runs[base]))
        if seeds:
            paired[config] = paired_points([by_seed[s] for s in seeds], [runs[base][s] for s in seeds], seeds)
    return {"runs": runs, "paired": paired}


def paired_points(values: Sequence[float], baseline: Sequence[float], seeds: Sequence[int]) -> dict[str, Any]:
    """Paired differences of shares (0..1) from the baseline's, seed by seed, in points (x 100): the
    per-seed differences, their mean, sd, 95% t interval, seeds gaining and two-sided Wilcoxon p."""
    diffs = 100.0 * (np.asarray(values, dtype=float) - np.asarray(baseline, dtype=float))
    return {
        "seeds": list(seeds),
        "diff_points": [round(float(d), 3) for d in diffs],
        "mean_points": float(diffs.mean()),
        "sd_points": float(diffs.std(ddof=1)) if len(diffs) > 1 else None,
        "ci95_points": t_interval(diffs),
        "seeds_gaining": int((diffs > 0).sum()),
        "wilcoxon_p": wilcoxon_p(diffs),
    }


def generation_cost(rows: Sequence[dict[str, Any]], levels: Sequence[float], window: int = 5) -> dict[str, Any]:
    """{"levels", "window", "runs": {config: {seed: {level: completions the run's nodes generated up to
    the first round whose `window`-round moving average of their mean reward reached `level`, or
    None}}}}."""
    curves: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    made: dict[tuple[str, int], dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for row in rows:
        curves[(row["config"], row["seed"])][row["round"]].append(row["reward_mean"])
        made[(row["config"], row["seed"])][row["round"]] += row["completions"]
    runs: dict[str, dict[int, dict[float, int | None]]] = {config: {} for config in config_order(rows)}
    for (config, seed), by_round in sorted(curves.items()):
        rounds = sorted(by_round)
        ma = moving_average([np.mean(by_round[r]) for r in rounds], window)
        spent = np.cumsum([made[(config, seed)][r] for r in rounds])
        reached = {level: np.nonzero(ma >= level)[0] for level in levels}
        runs[config][seed] = {level: int(spent[r[0]]) if r.size else None for level, r in reached.items()}
    return {"levels": list(levels), "window": window, "runs": runs}


def endpoints(
    rows: Sequence[dict[str, Any]],
    span: int = 20,
    known: dict[int, frozenset[str]] | None = None,
    window: int = 5,
    cost_levels: Sequence[float] = (),
) -> dict[str, Any]:
    base = baseline_config(rows)
    return {
        "learning_span": _span(rows, span)[0],
        "learning": learning(rows, span),
        "paired": {c: paired_endpoint(rows, c, base) for c in config_order(rows) if c != base} if base else {},
        "dataset_rewards": dataset_rewards(rows, span),
        "known": {k: sorted(v) for k, v in (known or {}).items()},
        "transfer": transfer(rows, known, span) if known else {},
        "generation_cost": generation_cost(rows, cost_levels, window) if cost_levels else None,
        "learning_zone": learning_zone(rows),
    }


def points_summary(p: dict[str, Any] | None) -> str:
    """One cell for a paired_points result: mean (sd), 95% CI, seeds gaining, Wilcoxon p."""
    if not p:
        return ""
    sd = f" (sd {p['sd_points']:.1f})" if p["sd_points"] is not None else ""
    ci = f", CI {p['ci95_points'][0]:+.1f} .. {p['ci95_points'][1]:+.1f}" if p["ci95_points"] else ""
    pval = f", p {p['wilcoxon_p']:.3g}" if p["wilcoxon_p"] is not None else ""
    return f"{p['mean_points']:+.1f}{sd}{ci}, {p['seeds_gaining']}/{len(p['seeds'])} gaining{pval}"


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
        lines += [
            "",
            "Paired cumulative-reward gain over the silo, seed by seed",
            "",
            "| config | seeds | mean gain | sd | 95% CI | seeds gaining | Wilcoxon p (two-sided) |",
            "|---|---|---|---|---|---|---|",
        ]
        for config, p in result["paired"].items():
            if p is None:
                continue
            ci = f"{p['ci95_pct'][0]:+.1f}% .. {p['ci95_pct'][1]:+.1f}%" if p["ci95_pct"] else ""
            pval = f"{p['wilcoxon_p']:.3g}" if p["wilcoxon_p"] is not None else ""
            sd = f"{p['gain_pct_sd']:.1f}" if p.get("gain_pct_sd") is not None else ""
            lines.append(
                f"| {config} | {len(p['seeds'])} | {p['gain_pct_mean']:+.1f}% | {sd} | {ci} | "
                f"{p['seeds_gaining']}/{len(p['seeds'])} | {pval} |"
            )
    zone = result.get("learning_zone")
    if zone and zone["runs"]:
        seeds = sorted({s for runs in zone["runs"].values() for s in runs})
        lines += [
            "",
            "Learning zone: share of the nodes' own groups with a mean reward strictly between 0 and 1",
            "",
            "| config | " + " | ".join(f"seed {s}" for s in seeds) + " | paired difference from the silo (points) |",
            "|---|" + "---|" * (len(seeds) + 1),
        ]
        for config, runs in zone["runs"].items():
            cells = [f"{runs[s]:.3f}" if s in runs else "" for s in seeds]
            lines.append(f"| {config} | " + " | ".join(cells) + f" | {points_summary(zone['paired'].get(config))} |")
    cost = result.get("generation_cost")
    if cost and cost["runs"]:
        seeds = sorted({s for runs in cost["runs"].values() for s in runs})
        lines += [
            "",
            f"Generation cost: completions the run's nodes generated until the {cost['window']}-round moving "
            "average of their mean reward first reached the level",
            "",
            "| config | level | " + " | ".join(f"seed {s}" for s in seeds) + " | mean |",
            "|---|---|" + "---|" * (len(seeds) + 1),
        ]
        for config, runs in cost["runs"].items():
            for level in cost["levels"]:
                spent = [runs[s][level] if s in runs else None for s in seeds]
                cells = [
                    "not reached" if s in runs and n is None else "" if n is None else str(n)
                    for s, n in zip(seeds, spent, strict=True)
                ]
                reached = [n for n in spent if n is not None]
                mean = (
                    f"{np.mean(reached):.0f}"
                    + (f" ({len(reached)} of {len(runs)})" if len(reached) < len(runs) else "")
                    if reached
                    else ""
                )
                lines.append(f"| {config} | {level:g} | " + " | ".join(cells) + f" | {mean} |")
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
    if result.get("transfer"):
        knows = "; ".join(f"node {k}: {', '.join(v)}" for k, v in sorted(result["known"].items()))
        lines += [
            "",
            f"Transfer: mean reward on the datasets a node's warm start does not know ({knows});",
            f"per seed: whole run / last {span} rounds",
            "",
        ]
        seeds = sorted({s for t in result["transfer"].values() for s in t["runs"]})
        lines += [
            "| config | "
            + " | ".join(f"seed {s}" for s in seeds)
            + " | mean, whole run | mean, last rounds | gain over silo (of the means) | seeds gaining | Wilcoxon p |",
            "|---|" + "---|" * (len(seeds) + 5),
        ]
        for config, t in result["transfer"].items():
            runs = t["runs"]
            cells = [
                f"{runs[s]['all']:.3f} / {runs[s].get('last', float('nan')):.3f}" if s in runs else "" for s in seeds
            ]
            mean_all = np.mean([r["all"] for r in runs.values()])
            mean_last = np.mean([r.get("last", np.nan) for r in runs.values()])
            p = t["paired"] or {}
            gain = f"{p['gain_pct_of_means']:+.0f}%" if p.get("gain_pct_of_means") is not None else ""
            gaining = f"{p['seeds_gaining']}/{len(p['seeds'])}" if p else ""
            pval = f"{p['wilcoxon_p']:.3g}" if p.get("wilcoxon_p") is not None else ""
            lines.append(
                f"| {config} | "
                + " | ".join(cells)
                + f" | {mean_all:.3f} | {mean_last:.3f} | {gain} | {gaining} | {pval} |"
            )
    return "\n".join(lines) + "\n"
