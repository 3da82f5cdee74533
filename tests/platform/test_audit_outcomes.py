"""Audit outcomes on real groups in PostgreSQL (audits.services, audits.jobs' sweep): a pass credits
the node's pending groups up to the audited weights, a failure or an expiry fails them, takes them out
of sampling and holds the node, whose next groups are stored unaudited."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from factories import make_node
from support.audits import OTHER_WEIGHTS, make_audit, pending_group

from audits import jobs, selection
from audits.models import Audit, AuditState, NodeHold
from audits.selectors import node_hold_get, owner_failed_audits, pending_credit
from audits.services import audit_fail, audit_pass, node_release
from pool.models import Rollout

pytestmark = pytest.mark.django_db


def states(*groups) -> list[str]:
    return [Rollout.objects.get(id=g.id).audit_state for g in groups]


def uploaded(audit: Audit) -> Audit:
    Audit.objects.filter(id=audit.id).update(state=AuditState.UPLOADED, upload_path="", queued_at=timezone.now())
    return Audit.objects.get(id=audit.id)


def test_a_pass_credits_the_pending_groups_up_to_the_audited_weights(node, user):
    t0 = timezone.now() - timedelta(hours=2)
    earlier = pending_group(node, weights=OTHER_WEIGHTS, created_at=t0)
    covered = [pending_group(node, created_at=t0 + timedelta(minutes=m)) for m in (10, 20)]
    later = pending_group(node, weights="ee" * 32, created_at=t0 + timedelta(minutes=30))
    unaudited = pending_group(node, created_at=t0 + timedelta(minutes=5), audit_state="unaudited")
    other = pending_group(make_node(owner=user, name="other"), created_at=t0)
    audit = uploaded(make_audit(node, covered))
    assert pending_credit(node_ids=[node.id])[node.id].groups == 4
    assert audit_pass(audit_id=audit.id, cpu_seconds=1.5, groups=2, tokens=40) is not None
    assert states(earlier, *covered) == ["audited"] * 3
    assert states(later, unaudited, other) == ["pending", "unaudited", "pending"]
    audit.refresh_from_db()
    assert (audit.state, audit.cpu_seconds, audit.groups_replayed, audit.tokens_replayed) == ("passed", 1.5, 2, 40)
    assert audit.finished_at is not None
    assert audit_pass(audit_id=audit.id, cpu_seconds=1, groups=1, tokens=1) is None  # decided once
    assert pending_credit(node_ids=[node.id])[node.id].groups == 1


def test_a_pass_leaves_the_groups_another_open_audit_asks_about_to_that_audit(node):
    # A node's made-up groups under weights it will never upload, caught by a draw, must not be credited
    # by the pass of its honest weights shared after them: they wait for their own audit, which expires.
    t0 = timezone.now() - timedelta(hours=1)
    honest = pending_group(node, created_at=t0)
    made_up = [pending_group(node, weights=OTHER_WEIGHTS, created_at=t0 + timedelta(minutes=m)) for m in (5, 6)]
    later_honest = pending_group(node, created_at=t0 + timedelta(minutes=10))
    caught = make_audit(node, made_up, weights=OTHER_WEIGHTS)
    audit = uploaded(make_audit(node, [honest]))
    assert audit_pass(audit_id=audit.id, cpu_seconds=1, groups=1, tokens=10) is not None
    assert states(honest, later_honest) == ["audited", "audited"]
    assert states(*made_up) == ["pending", "pending"]
    audit_fail(audit_id=caught.id, reason=jobs.EXPIRED_REASON, state=AuditState.EXPIRED)
    assert states(*made_up) == ["failed", "failed"]
    assert states(honest, later_honest) == ["audited", "audited"]


def test_a_failure_fails_the_pending_groups_takes_them_out_of_sampling_and_holds_the_node(node, user):
    passed_before = pending_group(node, audit_state="audited")
    pending = [pending_group(node) for _ in range(3)]
    assert all(Rollout.objects.get(id=g.id).sampleable for g in pending)
    other = pending_group(make_node(owner=user, name="other"))
    audit = uploaded(make_audit(node, pending[:1]))
    second = make_audit(node, pending[1:2], weights=OTHER_WEIGHTS)
    audit_fail(audit_id=audit.id, reason="group x, completion 0: token 3 is not the seeded draw")
    assert states(*pending) == ["failed"] * 3
    assert states(passed_before, other) == ["audited", "pending"]
    assert not Rollout.objects.filter(id__in=[g.id for g in pending], sampleable=True).exists()
    assert set(Rollout.objects.filter(id__in=[g.id for g in pending]).values_list("audit_reason", flat=True)) == {
        "audit_failed"
    }
    hold = node_hold_get(node_id=node.id)
    assert hold is not None and "token 3" in hold.reason
    second.refresh_from_db()
    assert second.state == "failed" and "another audit of this node failed" in second.reason
    # The contributor's inbox lists the failed audit with its reason.
    assert [a.id for a in owner_failed_audits(owner=user)] == [second.id, audit.id] or {
        a.id for a in owner_failed_audits(owner=user)
    } == {audit.id, second.id}


def test_a_held_nodes_new_groups_are_stored_unaudited_until_staff_release_it(node, admin_user):
    audit = make_audit(node, [pending_group(node)])
    audit_fail(audit_id=audit.id, reason="weights digest mismatch")
    fresh = pending_group(node, weights="77" * 32)
    assert selection.groups_stored(inserted={fresh.id}) == {}
    fresh.refresh_from_db()
    assert (fresh.audit_state, fresh.audit_reason) == ("unaudited", "node_held")
    assert not Audit.objects.filter(weights="77" * 32).exists()
    assert node_release(actor=admin_user, node_id=node.id) == 1
    assert NodeHold.objects.get(node=node).released_by == admin_user
    after = pending_group(node, weights="88" * 32)
    asked = selection.groups_stored(inserted={after.id})
    assert [a["weights"] for a in asked[node.id]] == ["88" * 32]


def test_the_sweep_expires_audits_past_their_deadline_as_failures(node, settings):
    settings.REDIS_URL = ""
    groups = [pending_group(node) for _ in range(2)]
    late = make_audit(node, groups, deadline_in=-1)
    waiting = make_audit(node, [], weights=OTHER_WEIGHTS, deadline_in=600)
    assert jobs.audit_sweep() == {"expired": 1, "requeued": 0, "errored": 0, "uploads_deleted": 0}
    late.refresh_from_db()
    assert (late.state, late.reason) == ("expired", jobs.EXPIRED_REASON)
    assert states(*groups) == ["failed", "failed"]
    assert node_hold_get(node_id=node.id) is not None
    waiting.refresh_from_db()
    assert waiting.state == "failed"  # the node's hold decided it too


def test_the_sweep_queues_again_an_audit_whose_job_was_lost(node, settings):
    settings.REDIS_URL = ""
    settings.SAPO_AUDIT_JOB_LEASE_SECONDS = 60
    audit = uploaded(make_audit(node, [pending_group(node)]))
    now = timezone.now()
    # Claimed by a job that died (its worker was killed): within the lease nothing happens...
    assert jobs.audit_claim(audit.id, now=now - timedelta(seconds=30)) is not None
    assert jobs.audit_claim(audit.id, now=now) is None  # ...and no second job takes it meanwhile
    assert jobs.audit_sweep(now=now)["requeued"] == 0
    # ...past it, the sweep queues it again and a job may claim it.
    assert jobs.audit_sweep(now=now + timedelta(seconds=61))["requeued"] == 1
    assert jobs.audits_waiting(now=now + timedelta(seconds=61)) == [audit.id]
    assert jobs.audit_claim(audit.id, now=now + timedelta(seconds=61)).attempts == 2
    # Out of attempts, the last job lost too: errored (not failed: the fault is the site's).
    settings.SAPO_AUDIT_JOB_ATTEMPTS = 2
    assert jobs.audit_sweep(now=now + timedelta(seconds=200)) == {
        "expired": 0,
        "requeued": 0,
        "errored": 1,
        "uploads_deleted": 0,
    }
    assert Audit.objects.get(id=audit.id).state == "errored"


def test_a_failed_group_stays_out_of_sampling_when_moderation_restores_it(node):
    from pool.models import ModerationStatus
    from pool.services import rollout_set_moderation

    group = pending_group(node)
    audit_fail(audit_id=make_audit(node, [group]).id, reason="weights digest mismatch")
    rollout_set_moderation(rollouts=[group.id], status=ModerationStatus.HELD)
    rollout_set_moderation(rollouts=[group.id], status=ModerationStatus.OK)
    group.refresh_from_db()
    assert (group.moderation_status, group.audit_state, group.sampleable) == ("ok", "failed", False)


def test_outcomes_move_the_folded_credit(node, user):
    from figures import stats
    from figures.models import NodeStats

    old = timezone.now() - timedelta(hours=2)
    groups = [pending_group(node, rewards=(1.0, 0.5), created_at=old) for _ in range(2)]
    other = make_node(owner=user, name="other")
    lost = [pending_group(other, rewards=(1.0, 1.0), created_at=old)]
    stats.stats_fold()
    assert NodeStats.objects.get(node=node).verified_reward == 0  # pending: not credited yet
    audit_pass(audit_id=uploaded(make_audit(node, groups)).id, cpu_seconds=1, groups=2, tokens=10)
    assert NodeStats.objects.get(node=node).verified_reward == pytest.approx(3.0)
    Rollout.objects.filter(id=lost[0].id).update(audit_state="audited")  # as if an earlier audit passed
    stats.stats_rebuild()
    assert NodeStats.objects.get(node=other).verified_reward == pytest.approx(2.0)
    pending_group(other, created_at=old)
    audit_fail(audit_id=make_audit(other, []).id, reason="no")  # audited groups keep their credit
    assert NodeStats.objects.get(node=other).verified_reward == pytest.approx(2.0)
