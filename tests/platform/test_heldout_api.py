"""The swarm API's held-out accuracy (`heldout` of /api/v1/swarms/<slug>/): the same selector as the swarm
page's panel, banned nodes left out."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.utils import timezone
from factories import make_credited_group, make_node

from figures.heldout import wilson
from nodes.models import Node
from pool.models import HeldoutScore, NodeRound
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.django_db


def test_the_swarm_api_gives_each_arms_held_out_accuracy_and_leaves_banned_nodes_out(client):
    swarm = swarm_default_ensure()
    sharer, loner, banned = make_node(name="sharer"), make_node(name="loner"), make_node(name="banned")
    for node, external in ((sharer, 4), (loner, 0), (banned, 0)):
        make_credited_group(node)
        NodeRound.objects.create(node=node, swarm=swarm, round=5, figures={"external": external}, used_count=0)
    at = timezone.now()
    for node, scores in ((sharer, (3.0, 4.0)), (loner, (1.0, 2.0)), (banned, (4.0, 4.0))):
        for score in scores:
            HeldoutScore.objects.create(node=node, swarm=swarm, round=5, questions=4, score=score, asked_at=at)
    Node.objects.filter(id=banned.id).update(banned_at=timezone.now())
    cache.clear()
    heldout = client.get(f"/api/v1/swarms/{swarm.slug}/").json()["heldout"]
    assert heldout["sharing"]["accuracy"] == pytest.approx(7 / 8) and heldout["sharing"]["nodes"] == 1
    assert (heldout["sharing"]["low"], heldout["sharing"]["high"]) == pytest.approx(wilson(7, 8))
    assert heldout["silo"]["accuracy"] == pytest.approx(3 / 8)  # the banned node's 8 of 8 left out
    assert heldout["silo"]["answers"] == 8 and heldout["enough"]
    assert len(heldout["curve"]) == 1 and heldout["curve"][0]["silo"]["answers"] == 8
