"""What the site shows of audits: a node's page its pending credit, its hold and its audits; the
contributor's /me/ each node's pending credit and the failed audits with their reason."""

from __future__ import annotations

import pytest
from support.audits import OTHER_WEIGHTS, make_audit, pending_group

from audits.models import Audit, AuditState
from audits.services import audit_fail

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_cached_figures")]


def test_the_node_page_shows_pending_credit_and_its_audits(client, node):
    pending_group(node, rewards=(1.0, 0.5))
    passed = make_audit(node, [])
    Audit.objects.filter(id=passed.id).update(state=AuditState.PASSED, cpu_seconds=2.25, groups_replayed=3)
    make_audit(node, [], weights=OTHER_WEIGHTS)
    page = client.get(f"/nodes/{node.id}/").content.decode()
    assert "Pending credit: <strong>1.5</strong> verified reward in <strong>1</strong> groups" in page
    assert page.count("badge-audit-") == 2 and "badge-audit-passed" in page and "badge-audit-requested" in page
    assert "held for review" not in page


def test_a_failed_audit_shows_as_a_hold_on_the_node_page_and_in_the_contributors_inbox(client, auth_client, node):
    audit = make_audit(node, [pending_group(node)])
    audit_fail(audit_id=audit.id, reason="group g, completion 1: token 2 is not the seeded draw")
    page = client.get(f"/nodes/{node.id}/").content.decode()
    assert "held for review" in page and "token 2 is not the seeded draw" in page
    me = auth_client.get("/me/").content.decode()
    assert "Failed audits" in me and "token 2 is not the seeded draw" in me
    assert "badge-audit-failed" in me


def test_the_node_page_shows_the_tokens_an_audit_replayed_and_an_errored_audit_without_a_hold(
    client, auth_client, node
):
    from audits.services import audit_error

    passed = make_audit(node, [])
    Audit.objects.filter(id=passed.id).update(state=AuditState.PASSED, groups_replayed=4, tokens_replayed=2917)
    errored = make_audit(node, [pending_group(node)], weights=OTHER_WEIGHTS)
    Audit.objects.filter(id=errored.id).update(state=AuditState.UPLOADED)
    audit_error(audit_id=errored.id, reason="the server could not replay it (KeyError, 3 attempts); no credit is lost")
    page = client.get(f"/nodes/{node.id}/").content.decode()
    assert 'data-label="Tokens replayed" class="num">2917<' in page
    assert "badge-audit-errored" in page and "no credit is lost" in page and "held for review" not in page
    assert "Failed audits" not in auth_client.get("/me/").content.decode()
