"""A swarm's catalogue carries each task's weight (welcome.catalogue): the node draws by it, and a
catalogue without weights draws exactly as before."""

from __future__ import annotations

import random
from collections import Counter

from sapo_node.tasks import EASY_CATALOGUE, Catalogue, TaskStream


def test_weights_go_through_the_wire_and_a_bad_one_means_alike():
    wire = {
        "name": "easy@2",
        "tasks": [
            {"dataset": "basic_arithmetic", "config": {}, "weight": 9},
            {"dataset": "base_conversion", "weight": 1},
        ],
    }
    catalogue = Catalogue.from_json(wire)
    assert catalogue.weights == (9.0, 1.0)
    assert Catalogue.from_json(catalogue.to_json()) == catalogue
    wire["tasks"][1]["weight"] = 0
    assert Catalogue.from_json(wire).weights == ()
    assert "weight" not in EASY_CATALOGUE.to_json()["tasks"][0]  # the named catalogues: as before


def test_a_weighted_catalogue_is_drawn_by_its_weights():
    catalogue = Catalogue("w", EASY_CATALOGUE.tasks[:2], weights=(9.0, 1.0))
    counts = Counter(ref.dataset for ref in TaskStream(catalogue, seed=3).draw(4000))
    share = counts[EASY_CATALOGUE.tasks[0].dataset] / 4000
    assert 0.87 < share < 0.93


def test_a_catalogue_without_weights_draws_as_before():
    rng = random.Random(5)
    expected = []
    for _ in range(50):
        spec = rng.choice(EASY_CATALOGUE.tasks)
        expected.append((spec.dataset, rng.randrange(10**9)))
    drawn = [(ref.dataset, ref.index) for ref in TaskStream(EASY_CATALOGUE, seed=5).draw(50)]
    assert drawn == expected
