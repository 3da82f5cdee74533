"""Held-out accuracy, swarm against silo: the share of held-out questions (sockets.heldout: questions no
node trains on, answered greedily by each node's current policy) that sharing nodes and silo nodes
answer right, over time, each with a Wilson 95% interval. Pure functions on hand-over rows, no I/O
(figures.swarm feeds them; docs/figures.md, "Held-out accuracy").

The unit is an answer: a check's score is the sum of its answers' rewards (each in [0, 1]), and an arm's
accuracy over a span is its answers' score over their count. The arms are figures.arms's (a node's latest
round report: J = 0 is silo). Answers of one node are not independent draws, and nodes choose their arm:
the interval measures the questions' sampling noise, not a controlled experiment.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from figures.arms import SHARING, SILO

#: Answers an arm needs before its accuracy is shown (fewer: "not enough data yet").
MIN_ANSWERS = 8
#: Spans the panel's time is cut into, each at least MIN_SPAN long.
SPANS = 6
MIN_SPAN = timedelta(minutes=1)
#: z of a two-sided 95% interval.
Z95 = 1.959964


@dataclass(frozen=True)
class HeldoutCell:
    """One scored check: whose, when, how many questions and their score."""

    node_id: int
    at: datetime
    questions: int
    score: float


def wilson(score: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson's interval for a proportion of `score` right out of `n` (None for n = 0); a fractional
    score (partial credit) is taken as that many right."""
    if n <= 0:
        return None
    p = min(1.0, max(0.0, score / n))
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy(score: float, n: int, *, minimum: int = MIN_ANSWERS) -> dict[str, Any]:
    """{"answers", "accuracy", "low", "high"}; the figures are None below `minimum` answers."""
    interval = wilson(score, n) if n >= max(1, minimum) else None
    return {
        "answers": n,
        "accuracy": score / n if interval else None,
        "low": interval[0] if interval else None,
        "high": interval[1] if interval else None,
    }


def compare_heldout(cells: Iterable[HeldoutCell], arms: dict[int, str | None]) -> dict[str, Any]:
    """The panel: each arm's accuracy over the whole span and per span of time (SPANS spans from the
    first check to the last), the nodes of each arm, and the nodes whose arm is unknown."""
    totals = {SHARING: [0.0, 0], SILO: [0.0, 0]}
    nodes: dict[str, set[int]] = {SHARING: set(), SILO: set()}
    unknown: set[int] = set()
    kept: list[tuple[HeldoutCell, str]] = []
    for cell in cells:
        arm = arms.get(cell.node_id)
        if arm is None:
            unknown.add(cell.node_id)
            continue
        kept.append((cell, arm))
        totals[arm][0] += cell.score
        totals[arm][1] += cell.questions
        nodes[arm].add(cell.node_id)
    curve = []
    if kept:
        first, last = min(c.at for c, _ in kept), max(c.at for c, _ in kept)
        width = max((last - first) / SPANS, MIN_SPAN)
        spans: dict[int, dict[str, list[float]]] = {}
        for cell, arm in kept:
            i = min(SPANS - 1, int((cell.at - first) / width))
            span = spans.setdefault(i, {SHARING: [0.0, 0], SILO: [0.0, 0]})
            span[arm][0] += cell.score
            span[arm][1] += cell.questions
        for i, span in sorted(spans.items()):
            curve.append(
                {
                    "start": first + i * width,
                    "end": first + (i + 1) * width,
                    # A span's figure however few its answers: its interval says how few.
                    SHARING: accuracy(*span[SHARING], minimum=1),
                    SILO: accuracy(*span[SILO], minimum=1),
                }
            )
    sharing, silo = accuracy(*totals[SHARING]), accuracy(*totals[SILO])
    return {
        "curve": curve,
        SHARING: {**sharing, "nodes": len(nodes[SHARING])},
        SILO: {**silo, "nodes": len(nodes[SILO])},
        "enough": sharing["accuracy"] is not None and silo["accuracy"] is not None,
        "unknown_nodes": len(unknown),
    }


def node_heldout(cells: list[HeldoutCell], rounds: list[int]) -> dict[str, Any]:
    """A node's own curve: each check (oldest first) with its round and accuracy, and the whole with its
    interval."""
    checks = [
        {"at": c.at, "round": r, "questions": c.questions, "accuracy": c.score / c.questions if c.questions else None}
        for c, r in zip(cells, rounds, strict=True)
    ]
    return {"checks": checks, "total": accuracy(sum(c.score for c in cells), sum(c.questions for c in cells))}
