"""Which weights are audited (audits.selection): a node's first digest always, a later one at the
configured rate, boosted for young, flagged and fast-earning nodes; one draw per digest; what the
node is told in its ack and welcome."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from factories import make_node
from support.audits import OTHER_WEIGHTS, WEIGHTS, pending_group

from audits import selection
from audits.models import Audit, AuditDraw, AuditGroup
from moderation.models import ModerationFlag
from nodes.models import Node
from pool.audit_seam import audits

pytestmark = pytest.mark.django_db


def old(node: Node) -> Node:
    Node.objects.filter(id=node.id).update(created_at=timezone.now() - timedelta(days=3))
    return Node.objects.get(id=node.id)


def stored(*groups) -> dict:
    return audits().groups_stored(inserted={g.id for g in groups})  # through the pool's seam


def test_a_nodes_first_weights_are_always_audited_and_the_ack_says_where_to_upload(node, settings):
    settings.SAPO_AUDIT_RATE = 0.0
    groups = [pending_group(node) for _ in range(3)]
    asked = stored(*groups)
    audit = Audit.objects.get(node=node)
    deadline = int(audit.deadline.timestamp())
    assert asked == {
        node.id: [
            {
                "id": str(audit.id),
                "weights": WEIGHTS,
                "upload": f"/api/v1/audits/{audit.id}/checkpoint",
                "deadline": deadline,
            }
        ]
    }
    assert audit.deadline - audit.requested_at == timedelta(seconds=settings.SAPO_AUDIT_DEADLINE_SECONDS)
    assert (audit.model, audit.state) == ("tiny-mini", "requested")
    assert set(AuditGroup.objects.filter(audit=audit).values_list("rollout_id", flat=True)) == {g.id for g in groups}
    # The same weights' next groups join the open audit; the ack asks nothing new.
    more = pending_group(node)
    assert stored(more) == {}
    assert AuditGroup.objects.filter(audit=audit, rollout_id=more.id).exists()
    # The welcome repeats what the node must still upload.
    assert audits().node_audits(node_id=node.id) == asked[node.id]


def test_later_weights_are_drawn_at_the_configured_rate_at_every_batch_that_adds_groups(node, settings):
    node = old(node)
    stored(pending_group(node))  # the first digest
    settings.SAPO_AUDIT_RATE = 0.0
    probe = pending_group(node, weights=OTHER_WEIGHTS)
    assert stored(probe) == {}
    draw = AuditDraw.objects.get(node=node, weights=OTHER_WEIGHTS)
    assert (draw.probability, draw.chosen) == (0.0, False)
    # A node told its digest was spared adds made-up groups under it: that batch is drawn again.
    settings.SAPO_AUDIT_RATE = 1.0
    made_up = pending_group(node, weights=OTHER_WEIGHTS)
    (asked,) = stored(made_up)[node.id]
    assert asked["weights"] == OTHER_WEIGHTS
    audit = Audit.objects.get(id=asked["id"])
    assert made_up.id in set(AuditGroup.objects.filter(audit=audit).values_list("rollout_id", flat=True))
    assert AuditDraw.objects.filter(node=node, weights=OTHER_WEIGHTS).count() == 2
    # While that audit is open, its digest's new groups join it without another draw.
    more = pending_group(node, weights=OTHER_WEIGHTS)
    assert stored(more) == {}
    assert AuditGroup.objects.filter(audit=audit, rollout_id=more.id).exists()
    assert AuditDraw.objects.filter(node=node, weights=OTHER_WEIGHTS).count() == 2


@pytest.mark.parametrize("why", ["young", "flagged", "top"])
def test_young_flagged_and_fast_earning_nodes_are_drawn_more_often(node, user, settings, why):
    settings.SAPO_AUDIT_RATE, settings.SAPO_AUDIT_BOOST = 0.05, 4.0
    if why != "young":
        node = old(node)
    stored(pending_group(node))
    if why == "flagged":
        ModerationFlag.objects.create(node=node, rule="outlier", detail="z = +18")
    if why == "top":
        for i in range(9):
            slow = old(make_node(owner=user, name=f"slow-{i}"))
            pending_group(slow, rewards=(0.0, 1.0), weights="11" * 32)
        pending_group(node, rewards=(1.0, 1.0, 1.0, 1.0))
    stored(pending_group(node, weights=OTHER_WEIGHTS))
    assert AuditDraw.objects.get(node=node, weights=OTHER_WEIGHTS).probability == pytest.approx(0.2)


def test_an_ordinary_node_is_drawn_at_the_base_rate(node, settings):
    settings.SAPO_AUDIT_RATE = 0.05
    node = old(node)
    stored(pending_group(node))
    stored(pending_group(node, weights=OTHER_WEIGHTS))
    assert AuditDraw.objects.get(node=node, weights=OTHER_WEIGHTS).probability == pytest.approx(0.05)


def smollm2_group(node: Node, weights: str):
    proof = {"challenge": "c", "weights": weights, "model": "smollm2-135m", "temperature": 1.0}
    return pending_group(node, weights=weights, proof=proof)


@pytest.mark.parametrize("boosted", [False, True])
def test_a_model_whose_audits_cost_more_is_drawn_at_its_own_lower_rate(node, settings, boosted):
    settings.SAPO_AUDIT_RATE, settings.SAPO_AUDIT_BOOST, settings.SAPO_AUDIT_RATES = 0.05, 4.0, {}
    if not boosted:
        node = old(node)
    assert stored(smollm2_group(node, WEIGHTS))  # a node's first weights: always, whatever the model
    stored(smollm2_group(node, OTHER_WEIGHTS))
    # SmolLM2's job costs 5.9 CPU-s: the rate over 5.9, boosted as any node's.
    expected = 0.05 / 5.9 * (4.0 if boosted else 1.0)
    assert AuditDraw.objects.get(node=node, weights=OTHER_WEIGHTS).probability == pytest.approx(expected)


def test_the_rate_per_model_follows_its_cost_and_the_settings_name_it(settings, monkeypatch):
    settings.SAPO_AUDIT_RATE, settings.SAPO_AUDIT_RATES = 0.05, {}
    assert selection.model_rate("tiny-mini") == selection.model_rate("tiny") == pytest.approx(0.05)
    assert selection.model_rate("smollm2-135m") == pytest.approx(0.05 / 5.9)
    assert selection.model_rate("small") == pytest.approx(0.05 / 5.9)  # not measured: counted as the costliest
    monkeypatch.setitem(selection.JOB_SECONDS, "costlier", 40.0)
    assert selection.model_rate("costlier") == selection.model_rate("small") == pytest.approx(0.005)  # the floor
    settings.SAPO_AUDIT_RATES = {"smollm2-135m": 0.02, "tiny": 0.0}
    assert (selection.model_rate("smollm2-135m"), selection.model_rate("tiny")) == (0.02, 0.0)
    assert selection.model_rate("tiny-mini") == pytest.approx(0.05)


def test_groups_without_a_valid_proof_are_never_audited(node):
    unaudited = pending_group(node, audit_state="unaudited")
    assert stored(unaudited) == {}
    assert not AuditDraw.objects.exists()


def test_drawn_follows_its_probability():
    assert not any(selection.drawn(0.0) for _ in range(1000))
    assert all(selection.drawn(1.0) for _ in range(1000))
    assert 150 < sum(selection.drawn(0.25) for _ in range(1000)) < 350
