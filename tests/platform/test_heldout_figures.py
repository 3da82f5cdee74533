"""figures.heldout's pure figures: Wilson's interval on hand-checked cases, the arms' totals and spans,
nodes of no arm left out, and the threshold below which an arm shows no figure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from figures.heldout import MIN_ANSWERS, HeldoutCell, compare_heldout, node_heldout, wilson

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_wilson_matches_its_textbook_values():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)  # symmetric about one half
    low, high = wilson(0, 10)
    assert low == 0 and high == pytest.approx(1.959964**2 / (10 + 1.959964**2))  # z^2 / (n + z^2)
    assert wilson(10, 10)[1] == pytest.approx(1) and wilson(0, 0) is None


def test_the_arms_totals_spans_and_the_unknown_nodes():
    cells = [
        HeldoutCell(1, T0, 4, 3.0),
        HeldoutCell(2, T0, 4, 1.0),
        HeldoutCell(1, T0 + timedelta(minutes=12), 4, 4.0),
        HeldoutCell(2, T0 + timedelta(minutes=12), 4, 2.0),
        HeldoutCell(3, T0 + timedelta(minutes=6), 4, 4.0),  # reports no J: in neither arm
    ]
    panel = compare_heldout(cells, {1: "sharing", 2: "silo", 3: None})
    assert panel["sharing"]["accuracy"] == pytest.approx(7 / 8) and panel["sharing"]["nodes"] == 1
    assert (panel["sharing"]["low"], panel["sharing"]["high"]) == pytest.approx(wilson(7, 8))
    assert panel["silo"]["accuracy"] == pytest.approx(3 / 8) and panel["enough"]
    assert panel["unknown_nodes"] == 1
    # 12 minutes in six spans of 2: the first and the last span hold a check each.
    assert [s["start"] for s in panel["curve"]] == [T0, T0 + timedelta(minutes=10)]
    assert [s["sharing"]["accuracy"] for s in panel["curve"]] == [0.75, 1.0]
    assert [s["silo"]["answers"] for s in panel["curve"]] == [4, 4]


def test_an_arm_below_the_threshold_has_no_figure():
    panel = compare_heldout([HeldoutCell(1, T0, MIN_ANSWERS - 1, 3.0)], {1: "sharing"})
    assert panel["sharing"]["accuracy"] is None and panel["sharing"]["answers"] == MIN_ANSWERS - 1
    assert not panel["enough"] and panel["silo"]["answers"] == 0
    assert panel["curve"][0]["sharing"]["accuracy"] == pytest.approx(3 / 7)  # a span shows its few answers


def test_a_nodes_own_curve():
    cells = [HeldoutCell(1, T0, 4, 1.0), HeldoutCell(1, T0 + timedelta(minutes=1), 4, 4.0)]
    mine = node_heldout(cells, [10, 20])
    assert [(c["round"], c["accuracy"]) for c in mine["checks"]] == [(10, 0.25), (20, 1.0)]
    assert mine["total"]["accuracy"] == pytest.approx(5 / 8) and mine["total"]["answers"] == 8
