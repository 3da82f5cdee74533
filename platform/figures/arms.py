"""Swarm against silo: the verified reward of nodes that train on external groups (J > 0) against
nodes in silo (J = 0), from what they share. Pure functions on hand-over data, no I/O
(figures.swarm feeds them from the folded tables; docs/figures.md, "Swarm against silo").

The unit is a node-hour: one node's credited groups in one hour, its value their verified reward
per completion. An arm's value in an hour is the mean over its node-hours; the gain is the mean of
the sharing arm's node-hours minus the silo arm's, with a Welch 95% interval (Student's t at the
Welch-Satterthwaite degrees of freedom). Node-hours of one node are not independent draws, and the
nodes chose their arm: the interval measures hour-to-hour noise, not a controlled experiment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from statistics import fmean, variance
from typing import Any

SHARING = "sharing"
SILO = "silo"

#: Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom; 1.96 above.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


@dataclass(frozen=True)
class NodeHourCell:
    node_id: int
    hour: datetime
    reward: float
    completions: int


def arm_of(figures: dict[str, Any] | None) -> str | None:
    """The arm a round report declares: silo for J = 0, sharing for J > 0, None when it says nothing
    usable (clients that send no `external`, or a value that is not a count)."""
    j = (figures or {}).get("external")
    if isinstance(j, bool) or not isinstance(j, (int, float)) or not math.isfinite(j) or j < 0:
        return None
    return SILO if j == 0 else SHARING


def t975(df: float) -> float:
    if df < 1:
        return _T975[0]
    return _T975[int(df) - 1] if df < len(_T975) + 1 else 1.96


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float] | None:
    """95% interval of mean(a) - mean(b); None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = variance(a) / len(a), variance(b) / len(b)
    diff = fmean(a) - fmean(b)
    if va + vb == 0:
        return diff, diff
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t975(df) * math.sqrt(va + vb)
    return diff - half, diff + half


def compare_arms(cells: Iterable[NodeHourCell], arms: dict[int, str | None]) -> dict[str, Any]:
    """The panel's figures: per-hour curve of each arm, nodes and node-hours per arm, the gain."""
    values: dict[str, list[float]] = {SHARING: [], SILO: []}
    nodes: dict[str, set[int]] = {SHARING: set(), SILO: set()}
    unknown: set[int] = set()
    by_hour: dict[datetime, dict[str, list[float]]] = {}
    for cell in cells:
        if cell.completions <= 0:
            continue
        arm = arms.get(cell.node_id)
        if arm is None:
            unknown.add(cell.node_id)
            continue
        value = cell.reward / cell.completions
        values[arm].append(value)
        nodes[arm].add(cell.node_id)
        by_hour.setdefault(cell.hour, {SHARING: [], SILO: []})[arm].append(value)
    curve = [
        {"hour": hour, SHARING: fmean(v[SHARING]) if v[SHARING] else None, SILO: fmean(v[SILO]) if v[SILO] else None}
        for hour, v in sorted(by_hour.items())
    ]
    means = {arm: fmean(v) if v else None for arm, v in values.items()}
    gain = means[SHARING] - means[SILO] if means[SHARING] is not None and means[SILO] is not None else None
    interval = welch_interval(values[SHARING], values[SILO])
    return {
        "curve": curve,
        "sharing": {"nodes": len(nodes[SHARING]), "node_hours": len(values[SHARING]), "mean_reward": means[SHARING]},
        "silo": {"nodes": len(nodes[SILO]), "node_hours": len(values[SILO]), "mean_reward": means[SILO]},
        "unknown_nodes": len(unknown),
        "gain": gain,
        "gain_low": interval[0] if interval else None,
        "gain_high": interval[1] if interval else None,
    }
