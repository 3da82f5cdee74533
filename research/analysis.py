"""The analysis of a study, from its per-node per-round CSV alone (no torch, no network).

    rounds.csv     one row per (configuration, seed, node, round): the node's mean reward that round
    table.csv/.md  cumulative reward per configuration: per seed, mean +- std over seeds, gain over silo
    rewards.png    average reward per round and its moving average, one line per configuration
                   (the paper's Figure 2)
    significance.csv/.png  per round: swarm vs silo node rewards across nodes x seeds, a two-sided
                   Mann-Whitney U (or Welch, or paired Wilcoxon signed-rank) test, Benjamini-Hochberg
                   adjusted over rounds, plotted as -log10 p with the 0.05 line (the paper's Figure 3)
    endpoints.md   the pre-registered endpoints (endpoints.py) and, when the study evaluated its nodes
                   (heldout.csv), their held-out accuracy before and after (heldout.py)
    summary.json   all of the above as numbers

Cumulative reward of a run = the sum over its nodes and rounds of each node's mean reward in that
round (mean over its B x G completions). The paper's absolute numbers depend on its own swarm size
and length; the gain in percent over the silo does not depend on that scale, so that is what to compare.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from research.endpoints import endpoints, endpoints_markdown, node_known
from research.heldout import markdown as heldout_markdown
from research.heldout import summarise as heldout_summary
from research.runs import baseline_config, config_counts, config_order, cumulative_by_run, moving_average

if TYPE_CHECKING:
    from research.presets import StudyConfig

#: The columns of rounds.csv, in order. `questions` lists the round's question identities as
#: "dataset/seed/index" joined by ";" (same in every configuration for a given node, seed, round).
ROUND_FIELDS = (
    "config",
    "local",
    "external",
    "seed",
    "node",
    "round",
    "reward_mean",
    "reward_std",
    "completions",
    "local_kept",
    "external_kept",
    "external_offered",
    "external_invalid",
    "zero_advantage_share",
    "loss",
    "clip_fraction",
    "accepted",
    "rejected",
    "pending",
    "seconds",
    "questions",
    "question_rewards",
)
#: Columns a rounds.csv written before they existed may lack (read as empty).
OPTIONAL_FIELDS = {"question_rewards"}
INT_FIELDS = {
    "local",
    "external",
    "seed",
    "node",
    "round",
    "completions",
    "local_kept",
    "external_kept",
    "external_offered",
    "external_invalid",
    "accepted",
    "rejected",
    "pending",
}
FLOAT_FIELDS = {"reward_mean", "reward_std", "zero_advantage_share", "loss", "clip_fraction", "seconds"}

#: The paper's cumulative rewards (Table 1 of arXiv 2509.08721), for the reading in the docs.
PAPER_CUMULATIVE = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}

SIGNIFICANCE_LEVEL = 0.05
POOLED = "swarm (pooled)"


# ---------------------------------------------------------------------------- the CSV


def write_rounds(path: Path, rows: Iterable[dict[str, Any]], *, append: bool = False) -> None:
    path = Path(path)
    new = not append or not path.exists() or path.stat().st_size == 0
    with path.open("a" if append else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=ROUND_FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for row in rows:
            writer.writerow(row)


def read_rounds(path: Path) -> list[dict[str, Any]]:
    """rounds.csv with numbers typed; raises ValueError if a column is missing."""
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        missing = set(ROUND_FIELDS) - OPTIONAL_FIELDS - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        rows = []
        for raw in reader:
            row: dict[str, Any] = dict(raw)
            for name in OPTIONAL_FIELDS:
                row[name] = row.get(name) or ""
            for name in INT_FIELDS:
                row[name] = int(raw[name])
            for name in FLOAT_FIELDS:
                row[name] = float(raw[name]) if raw[name] not in ("", None) else math.nan
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------- configurations


# ---------------------------------------------------------------------------- the table


@dataclass
class TableRow:
    config: str
    local: int
    external: int
    #: {seed: cumulative reward of that run}
    per_seed: dict[int, float]
    mean: float
    std: float
    #: 100 * (mean / silo mean - 1); None for the silo itself or when there is no silo.
    gain_pct: float | None = None
    #: The same gain computed seed by seed (run of seed s against the silo run of seed s): mean and std.
    paired_gain_pct_mean: float | None = None
    paired_gain_pct_std: float | None = None
    paper_cumulative: float | None = None
    paper_gain_pct: float | None = None
    per_seed_gain_pct: dict[int, float] = field(default_factory=dict)


def _std(values: Sequence[float]) -> float:
    """Sample standard deviation (ddof 1); 0 for a single value."""
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def summary_table(rows: Sequence[dict[str, Any]]) -> list[TableRow]:
    totals = cumulative_by_run(rows)
    base = baseline_config(rows)
    base_mean = float(np.mean(list(totals[base].values()))) if base else None
    paper_base = PAPER_CUMULATIVE.get(base or "")
    table = []
    for config in config_order(rows):
        local, external = config_counts(rows, config)
        per_seed = totals[config]
        values = list(per_seed.values())
        row = TableRow(config, local, external, per_seed, float(np.mean(values)), _std(values))
        if base and config != base and base_mean:
            row.gain_pct = 100.0 * (row.mean / base_mean - 1.0)
            paired = {s: 100.0 * (v / totals[base][s] - 1.0) for s, v in per_seed.items() if totals[base].get(s)}
            row.per_seed_gain_pct = paired
            if paired:
                row.paired_gain_pct_mean = float(np.mean(list(paired.values())))
                row.paired_gain_pct_std = _std(list(paired.values()))
        if config in PAPER_CUMULATIVE:
            row.paper_cumulative = PAPER_CUMULATIVE[config]
            if paper_base and config != base:
                row.paper_gain_pct = 100.0 * (PAPER_CUMULATIVE[config] / paper_base - 1.0)
        table.append(row)
    return table


def _fmt_gain(value: float | None) -> str:
    return "" if value is None else f"{value:+.1f}%"


def markdown_table(table: Sequence[TableRow]) -> str:
    """The table as GitHub markdown, ready to paste."""
    seeds = sorted({s for row in table for s in row.per_seed})
    head = [
        "config (I/J)",
        "groups used (I/J)",
        "cumulative reward, mean ± std",
        *[f"seed {s}" for s in seeds],
        "gain vs silo",
        "paired gain, mean ± std",
        "paper",
        "paper gain",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        paired = (
            f"{row.paired_gain_pct_mean:+.1f}% ± {row.paired_gain_pct_std:.1f}"
            if row.paired_gain_pct_mean is not None and row.paired_gain_pct_std is not None
            else ""
        )
        cells = [
            row.config,
            f"{row.local}/{row.external}",
            f"{row.mean:.2f} ± {row.std:.2f}",
            *[f"{row.per_seed[s]:.2f}" if s in row.per_seed else "" for s in seeds],
            _fmt_gain(row.gain_pct),
            paired,
            f"{row.paper_cumulative:.2f}" if row.paper_cumulative is not None else "",
            _fmt_gain(row.paper_gain_pct),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table_csv(path: Path, table: Sequence[TableRow]) -> None:
    seeds = sorted({s for row in table for s in row.per_seed})
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "config",
                "local",
                "external",
                "cumulative_mean",
                "cumulative_std",
                *[f"seed_{s}" for s in seeds],
                "gain_pct",
                "paired_gain_pct_mean",
                "paired_gain_pct_std",
                "paper_cumulative",
                "paper_gain_pct",
            ]
        )
        for row in table:
            writer.writerow(
                [
                    row.config,
                    row.local,
                    row.external,
                    f"{row.mean:.4f}",
                    f"{row.std:.4f}",
                    *[f"{row.per_seed[s]:.4f}" if s in row.per_seed else "" for s in seeds],
                    _num(row.gain_pct),
                    _num(row.paired_gain_pct_mean),
                    _num(row.paired_gain_pct_std),
                    _num(row.paper_cumulative),
                    _num(row.paper_gain_pct),
                ]
            )


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


# ---------------------------------------------------------------------------- curves


def round_curves(rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """{config: reward per round (index 0 = round 1), averaged over nodes and seeds}."""
    sums: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        sums[row["config"]][row["round"]].append(row["reward_mean"])
    curves = {}
    for config in config_order(rows):
        by_round = sums[config]
        last = max(by_round)
        curves[config] = np.array([np.mean(by_round[r]) if by_round.get(r) else np.nan for r in range(1, last + 1)])
    return curves


# ---------------------------------------------------------------------------- significance


@dataclass
class SigRow:
    round: int
    comparison: str
    n_swarm: int
    n_silo: int
    mean_swarm: float
    mean_silo: float
    statistic: float
    p: float
    p_adj: float = math.nan

    @property
    def significant(self) -> bool:
        return self.p_adj < SIGNIFICANCE_LEVEL


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (step-up, monotone, capped at 1), in the input order."""
    p = np.asarray(p_values, dtype=float)
    n = len(p)
    if n == 0:
        return p
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, n + 1)
    adjusted = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(adjusted, 1.0)
    return out


TESTS = ("mannwhitney", "welch", "wilcoxon")


def compare(swarm: Sequence[float], silo: Sequence[float], method: str = "mannwhitney") -> tuple[float, float]:
    """(statistic, two-sided p) of swarm vs silo values; p = 1 when the test cannot tell (no spread).

    mannwhitney and welch compare two independent samples; wilcoxon is the signed-rank test of the
    paired differences swarm[i] - silo[i] (same seed, node and round: same questions, same start)."""
    from scipy import stats

    a, b = np.asarray(swarm, dtype=float), np.asarray(silo, dtype=float)
    if method == "wilcoxon":
        if len(a) != len(b):
            raise ValueError("the paired test needs one silo value per swarm value")
        d = a - b
        if len(d) < 2 or not np.any(np.abs(d) > 1e-12):
            return math.nan, 1.0
        result = stats.wilcoxon(d, alternative="two-sided")
    elif len(a) < 2 or len(b) < 2:
        return math.nan, 1.0
    elif method == "mannwhitney":
        if np.ptp(np.concatenate([a, b])) == 0:
            return float(len(a) * len(b) / 2), 1.0  # every value equal: no evidence either way
        result = stats.mannwhitneyu(a, b, alternative="two-sided", method="auto")
    elif method == "welch":
        result = stats.ttest_ind(a, b, equal_var=False)
    else:
        raise ValueError(f"unknown test {method!r}: one of {', '.join(TESTS)}")
    p = float(result.pvalue)
    return float(result.statistic), (1.0 if math.isnan(p) else p)


def node_values(
    rows: Sequence[dict[str, Any]], config: str, round: int, window: int = 1
) -> dict[tuple[int, int], float]:
    """{(seed, node): the node's reward at `round`} (mean over the trailing `window` rounds)."""
    by_node: dict[tuple[int, int], list[float]] = defaultdict(list)
    for row in rows:
        if row["config"] == config and round - window < row["round"] <= round:
            by_node[(row["seed"], row["node"])].append(row["reward_mean"])
    return {key: float(np.mean(v)) for key, v in sorted(by_node.items())}


def significance(rows: Sequence[dict[str, Any]], *, method: str = "mannwhitney", window: int = 1) -> list[SigRow]:
    """Per round and per comparison (each swarm configuration vs the silo, and all swarm
    configurations pooled vs the silo): node rewards across nodes x seeds, BH-adjusted over the
    rounds of each comparison. With wilcoxon, n_swarm = n_silo = the number of pairs."""
    base = baseline_config(rows)
    if base is None:
        return []
    swarm_configs = [c for c in config_order(rows) if c != base]
    rounds = sorted({row["round"] for row in rows})
    out: list[SigRow] = []
    comparisons = [(c, [c]) for c in swarm_configs]
    if len(swarm_configs) > 1:
        comparisons.append((POOLED, swarm_configs))
    for label, configs in comparisons:
        family = []
        for r in rounds:
            silo_by_node = node_values(rows, base, r, window)
            if method == "wilcoxon":  # pairs: each swarm value with the silo value of its seed and node
                pairs = [
                    (v, silo_by_node[k])
                    for c in configs
                    for k, v in node_values(rows, c, r, window).items()
                    if k in silo_by_node
                ]
                swarm, silo = [a for a, _ in pairs], [b for _, b in pairs]
            else:
                swarm = [v for c in configs for v in node_values(rows, c, r, window).values()]
                silo = list(silo_by_node.values())
            statistic, p = compare(swarm, silo, method)
            family.append(
                SigRow(r, f"{label} vs {base}", len(swarm), len(silo), _mean(swarm), _mean(silo), statistic, p)
            )
        for row, p_adj in zip(family, benjamini_hochberg([s.p for s in family]), strict=True):
            row.p_adj = float(p_adj)
        out.extend(family)
    return out


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def write_significance_csv(path: Path, sig: Sequence[SigRow]) -> None:
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "round",
                "comparison",
                "n_swarm",
                "n_silo",
                "mean_swarm",
                "mean_silo",
                "statistic",
                "p",
                "p_adj",
                "significant",
            ]
        )
        for s in sig:
            writer.writerow(
                [
                    s.round,
                    s.comparison,
                    s.n_swarm,
                    s.n_silo,
                    f"{s.mean_swarm:.6f}",
                    f"{s.mean_silo:.6f}",
                    f"{s.statistic:.6g}",
                    f"{s.p:.6g}",
                    f"{s.p_adj:.6g}",
                    int(s.significant),
                ]
            )


# ---------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_rewards(curves: dict[str, np.ndarray], path: Path, *, window: int, title: str = "") -> None:
    """Average reward per round (thin) and its trailing moving average (thick), per configuration."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for i, (config, curve) in enumerate(curves.items()):
        color = f"C{i}"
        rounds = np.arange(1, len(curve) + 1)
        ax.plot(rounds, curve, color=color, alpha=0.25, linewidth=1)
        ax.plot(rounds, moving_average(curve, window), color=color, linewidth=2, label=f"{config}")
    ax.set_xlabel("round")
    ax.set_ylabel("average reward (nodes x seeds)")
    ax.set_title(title or f"Average reward per round (moving average over {window} rounds)")
    ax.grid(alpha=0.3)
    ax.legend(title="local/external")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_significance(sig: Sequence[SigRow], path: Path, *, title: str = "") -> None:
    """-log10 of the BH-adjusted p-value per round, per comparison (dotted: unadjusted), with the 0.05 line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    by_comparison: dict[str, list[SigRow]] = defaultdict(list)
    for s in sig:
        by_comparison[s.comparison].append(s)
    for i, (label, family) in enumerate(by_comparison.items()):
        rounds = [s.round for s in family]
        values = [-math.log10(max(s.p_adj, 1e-300)) for s in family]
        raw = [-math.log10(max(s.p, 1e-300)) for s in family]
        style = {"color": "black", "linewidth": 2.2} if label.startswith(POOLED) else {"color": f"C{i + 1}"}
        ax.plot(rounds, values, marker=".", label=label, **style)
        ax.plot(rounds, raw, linestyle=":", linewidth=1, alpha=0.5, color=style["color"])
    ax.axhline(-math.log10(SIGNIFICANCE_LEVEL), color="red", linestyle="--", linewidth=1, label="adjusted p = 0.05")
    ax.set_xlabel("round")
    ax.set_ylabel("-log10 adjusted p (BH)")
    ax.set_title(title or "Swarm vs silo, per round (two-sided test across nodes x seeds; dotted: unadjusted p)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------- everything at once


def oscillation(curve: Sequence[float], window: int) -> float:
    """How much a curve swings around its own moving average: the std of (curve - moving average)."""
    x = np.asarray(curve, dtype=float)
    if len(x) < 2:
        return 0.0
    return float(np.nanstd(x - moving_average(x, window)))


def analyse(
    rows: Sequence[dict[str, Any]],
    out: Path,
    *,
    window: int = 5,
    method: str = "mannwhitney",
    sig_window: int = 1,
    meta: dict[str, Any] | None = None,
    heldout: Sequence[dict[str, Any]] = (),
    cost_levels: Sequence[float] = (),
) -> dict[str, Any]:
    """Write table.csv, table.md, rewards.png, significance.csv, significance.png, endpoints.md and
    summary.json into `out`; returns the summary. `heldout`: the rows of heldout.csv (research/heldout.py)
    of the same runs, whose tables join endpoints.md; `cost_levels`: the rewards whose generation cost
    endpoints.md gives (endpoints.generation_cost)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not rows:
        raise ValueError("no rounds to analyse")
    table = summary_table(rows)
    write_table_csv(out / "table.csv", table)
    (out / "table.md").write_text(markdown_table(table))
    curves = round_curves(rows)
    plot_rewards(curves, out / "rewards.png", window=window)
    sig = significance(rows, method=method, window=sig_window)
    write_significance_csv(out / "significance.csv", sig)
    plot_significance(sig, out / "significance.png")
    found = endpoints(rows, known=node_known(meta), window=window, cost_levels=cost_levels)
    held = heldout_summary(heldout, baseline_config(rows), config_order(rows)) if heldout else None
    (out / "endpoints.md").write_text(endpoints_markdown(found) + ("\n" + heldout_markdown(held) if held else ""))

    first_significant: dict[str, int | None] = {}
    for s in sig:
        first_significant.setdefault(s.comparison, None)
        if s.significant and first_significant[s.comparison] is None:
            first_significant[s.comparison] = s.round
    summary = {
        "meta": meta or {},
        "rounds": max(row["round"] for row in rows),
        "seeds": sorted({row["seed"] for row in rows}),
        "nodes": sorted({row["node"] for row in rows}),
        "baseline": baseline_config(rows),
        "table": [asdict(row) for row in table],
        "curves": {c: [round(float(v), 6) for v in curve] for c, curve in curves.items()},
        "moving_average_window": window,
        "endpoints": found,
        "heldout": held,
        "oscillation": {c: round(oscillation(curve, window), 6) for c, curve in curves.items()},
        "significance": {
            "method": method,
            "window": sig_window,
            "level": SIGNIFICANCE_LEVEL,
            "significant_rounds": {
                label: sum(1 for s in sig if s.comparison == label and s.significant) for label in first_significant
            },
            "first_significant_round": first_significant,
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    return summary


def analyse_study(
    cfg: StudyConfig,
    rows: Sequence[dict[str, Any]],
    out: Path,
    *,
    meta: dict[str, Any],
    heldout: Sequence[dict[str, Any]],
) -> dict[str, Any]:
    """`analyse` with the analysis settings of study `cfg` (its window, test and cost levels)."""
    return analyse(
        rows,
        out,
        window=cfg.window,
        method=cfg.test,
        sig_window=cfg.sig_window,
        meta=meta,
        heldout=heldout,
        cost_levels=cfg.cost_levels,
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value)}")
