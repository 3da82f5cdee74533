"""Helpers for the web app's tests: pool rows as the pool's services would have stored them.

(Rows are written directly, without re-verification, so figure tests stay fast; the browser journey
drives the real WebSocket path.)
"""

from __future__ import annotations

from datetime import datetime

from django.core.cache import cache
from django.utils import timezone

from nodes.models import Node
from pool.models import Consumption, ModerationStatus, NodeRound, Rollout, RolloutText, Verdict
from sapo_node.ids import uuid7
from swarms.models import Swarm
from swarms.services import swarm_default_ensure


def make_group(
    node: Node,
    *,
    rewards: tuple[float, ...] = (1.0, 0.0),
    verdict: str = Verdict.ACCEPTED,
    reason: str = "",
    dataset: str = "basic_arithmetic",
    moderation_status: str = ModerationStatus.OK,
    created_at: datetime | None = None,
    round: int = 1,
    swarm: Swarm | None = None,
    audit_state: str = "audited",
) -> Rollout:
    """One stored group of `node` (in `swarm`; none: the default); marks the node seen at that time, as
    sharing does. Audited unless told otherwise: the figures' tests count credit, which only audited
    groups earn (the audit path itself is tested in test_audit_*)."""
    created_at = created_at or timezone.now()
    accepted = verdict == Verdict.ACCEPTED
    variance = accepted and len(set(rewards)) > 1
    sampleable = variance and moderation_status == ModerationStatus.OK
    rollout = Rollout.objects.create(
        id=uuid7(created_at),
        node=node,
        swarm=swarm or swarm_default_ensure(),
        catalogue_version=1,
        round=round,
        dataset=dataset,
        seed=1234,
        index=Rollout.objects.count(),
        completion_count=len(rewards),
        claimed_rewards=list(rewards),
        verified_rewards=list(rewards),
        verdict=verdict,
        reason="" if accepted else (reason or "reward_mismatch"),
        moderation_status=moderation_status,
        has_variance=variance,
        sampleable=sampleable,
        sample_seq=Rollout.objects.count() + 1 if sampleable else None,
        created_at=created_at,
        audit_state=audit_state,
    )
    RolloutText.objects.create(
        rollout=rollout,
        swarm_id=rollout.swarm_id,
        created_at=created_at,
        question=f"What is {len(rewards)} + 1?",
        answer="2",
        completions=[f"<answer>{r}</answer>" for r in rewards],
    )
    if node.last_seen_at is None or node.last_seen_at < created_at:
        Node.objects.filter(id=node.id).update(last_seen_at=created_at)
        node.last_seen_at = created_at
    return rollout


def make_consumption(consumer: Node, rollout: Rollout, *, round: int = 1) -> Consumption:
    Node.objects.filter(id=consumer.id).update(last_seen_at=timezone.now())
    return Consumption.objects.create(
        consumer=consumer, rollout=rollout, author_id=rollout.node_id, swarm_id=rollout.swarm_id, round=round
    )


def make_report(node: Node, *, round: int = 1, reward_mean: float = 0.5, swarm: Swarm | None = None) -> NodeRound:
    return NodeRound.objects.create(
        node=node,
        swarm=swarm or swarm_default_ensure(),
        round=round,
        figures={"reward_mean": reward_mean},
        used_count=0,
    )


def fresh_figures() -> None:
    """Forget cached figures (they live a few seconds), so the next read recomputes."""
    cache.clear()


def test_make_group_marks_the_node_seen(node):
    make_group(node)
    node.refresh_from_db()
    assert node.last_seen_at is not None
