"""The contributor's rejection inbox on /me/ and at /api/v1/me/inbox/: one selector
(moderation.selectors.rollout_inbox_list) feeds both, with every reason a group left the pool for."""

from __future__ import annotations

import pytest
from factories import make_node
from support.moderation import group, long_reasoning, share, staff
from test_web_data import fresh_figures, make_group

from figures import stats
from moderation.rules import rules_forget
from moderation.services import rollout_moderate
from pool.models import ModerationStatus, Verdict

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh():
    fresh_figures()
    rules_forget()
    yield
    fresh_figures()
    rules_forget()


def test_a_moderators_reason_reaches_the_contributor_on_me_and_in_the_api(auth_client, api_client, node):
    copied = make_group(node)
    rollout_moderate(actor=staff(), rollout_id=copied.id, action="quarantine", reason="copied from node X")

    page = auth_client.get("/me/").content.decode()
    inbox = page[page.index('id="inbox"') :]
    assert "copied from node X" in inbox and "quarantined" in inbox

    rows = api_client.get("/api/v1/me/inbox/").json()
    assert [(r["id"], r["state"], r["code"], r["reason"], r["node"]) for r in rows] == [
        (str(copied.id), "quarantined", "moderator", "Moderator: copied from node X", "laptop")
    ]


def test_rule_holds_and_verifier_rejections_show_their_reasons(auth_client, api_client, node):
    g = group(11)
    share(make_node(), group(11, completions=long_reasoning(g)))  # another node's original
    (held,) = share(node, group(11, completions=long_reasoning(g)))  # held by the exact-copy rule
    forged = make_group(node, verdict=Verdict.REJECTED, reason="answer_mismatch")
    make_group(node)  # accepted: not in the inbox

    rows = {r["id"]: r for r in api_client.get("/api/v1/me/inbox/").json()}
    assert set(rows) == {str(held.id), str(forged.id)}
    assert (rows[str(held.id)]["state"], rows[str(held.id)]["code"]) == ("held", "duplicate_exact")
    assert rows[str(held.id)]["reason"].startswith("Automatic filter: 4 of 4 completions are exact copies")
    assert (rows[str(forged.id)]["state"], rows[str(forged.id)]["code"]) == ("rejected", "answer_mismatch")
    assert rows[str(forged.id)]["reason"] == "Verification: Ground truth does not match its task."

    inbox = auth_client.get("/me/").content.decode().split('id="inbox"')[1]
    assert "exact copies of other nodes" in inbox and "answer_mismatch" in inbox and "held" in inbox


def _out_of_pool(node, count: int) -> None:
    moderator = staff("mod")
    for i in range(count):
        kind = i % 3
        if kind == 0:
            make_group(node, verdict=Verdict.REJECTED, reason="reward_mismatch")
        else:
            rollout = make_group(node)
            action = "quarantine" if kind == 1 else "reject"
            rollout_moderate(actor=moderator, rollout_id=rollout.id, action=action, reason=f"reason {i}")
    make_group(node, moderation_status=ModerationStatus.HELD)  # held without a decision row


def test_the_inbox_costs_the_same_queries_for_4_and_14_entries(
    auth_client, api_client, node, django_assert_num_queries, django_assert_max_num_queries, throttle_queries
):
    _out_of_pool(node, 3)
    with django_assert_num_queries(3 + throttle_queries):  # session, user, the inbox (node and decision joined)
        assert len(api_client.get("/api/v1/me/inbox/").json()) == 4
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_max_num_queries(30) as few:
        auth_client.get("/me/")
    _out_of_pool(node, 9)
    with django_assert_num_queries(3 + throttle_queries):
        assert len(api_client.get("/api/v1/me/inbox/").json()) == 14
    fresh_figures()
    stats.stats_fold_if_due()
    with django_assert_num_queries(len(few.captured_queries)):
        page = auth_client.get("/me/").content.decode()
    assert page.count('data-label="Why"') == 14
