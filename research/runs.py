"""The rows of a study (one per node and round, as in rounds.csv): its configurations and each run's
cumulative reward. Shared by the analysis and the pre-registered endpoints."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np


def config_order(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Configuration labels, the silo first, then by growing share of external groups."""
    seen: dict[str, tuple[int, int]] = {}
    for row in rows:
        seen.setdefault(row["config"], (row["local"], row["external"]))
    return sorted(seen, key=lambda c: (seen[c][1] / max(1, sum(seen[c])), c))


def baseline_config(rows: Sequence[dict[str, Any]]) -> str | None:
    """The silo configuration (no external groups), or None if the study has none."""
    silos = [c for c in config_order(rows) if config_counts(rows, c)[1] == 0]
    return silos[0] if silos else None


def config_counts(rows: Sequence[dict[str, Any]], config: str) -> tuple[int, int]:
    """(local, external) groups per round of a configuration."""
    for row in rows:
        if row["config"] == config:
            return row["local"], row["external"]
    raise KeyError(config)


def cumulative_by_run(rows: Sequence[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """{config: {seed: sum over nodes and rounds of the node's round mean reward}}."""
    totals: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for row in rows:
        totals[row["config"]][row["seed"]] += row["reward_mean"]
    return {c: dict(sorted(s.items())) for c, s in totals.items()}


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over the last `window` values (fewer at the start, so the curve starts at round 1)."""
    x = np.asarray(values, dtype=float)
    out = np.empty_like(x)
    for i in range(len(x)):
        out[i] = np.nanmean(x[max(0, i - window + 1) : i + 1])
    return out


def t_interval(values: Sequence[float]) -> list[float] | None:
    """The 95% t interval of the mean of `values` (None with fewer than two)."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return [float(x.mean()) - half, float(x.mean()) + half]


def wilcoxon_p(differences: Sequence[float]) -> float | None:
    """Two-sided Wilcoxon signed-rank p of paired differences (None with fewer than two, or all zero)."""
    from scipy import stats

    d = np.asarray(differences, dtype=float)
    if len(d) < 2 or not np.any(d != 0):
        return None
    return float(stats.wilcoxon(d, alternative="two-sided").pvalue)
