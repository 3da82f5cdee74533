"""The moderation pages and actions: permissions, queue, single and bulk decisions, audit log, inbox."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.db.utils import ProgrammingError
from django.urls import reverse
from factories import make_node, make_swarm, make_user
from support.moderation import group, share, staff
from support.pool import sampled

from moderation.models import AuditEntry, ModerationDecision
from moderation.rules import rules_current, rules_forget
from moderation.selectors import rollout_inbox_list
from pool.models import ModerationStatus, Rollout
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.django_db

ROLLOUT_ID = "00000000-0000-4000-8000-000000000001"
GET_URLS = [
    reverse("moderation:queue"),
    reverse("moderation:nodes"),
    reverse("moderation:audit"),
    reverse("moderation:rules"),
]
POST_URLS = [
    reverse("moderation:rollout_action", args=[ROLLOUT_ID]),
    reverse("moderation:bulk_preview"),
    reverse("moderation:bulk_apply"),
    reverse("moderation:node_action", args=[1]),
    reverse("moderation:contributor_action", args=[1]),
    reverse("moderation:flag_resolve", args=[1]),
    reverse("moderation:rule_update", args=["length"]),
]


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


@pytest.fixture
def moderator():
    return staff("moderator")


@pytest.fixture
def mod_client(client, moderator):
    client.force_login(moderator)
    return client


def htmx_post(client, url: str, data: dict):
    return client.post(url, data, HTTP_HX_REQUEST="true")


# --- permissions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", GET_URLS + POST_URLS)
def test_anonymous_visitors_are_sent_to_the_login_page(client, url):
    response = client.post(url) if url in POST_URLS else client.get(url)
    assert response.status_code == 302
    assert response.url.startswith(reverse("accounts:login"))


@pytest.mark.parametrize("url", GET_URLS + POST_URLS)
def test_contributors_get_403(auth_client, url):
    response = auth_client.post(url, {"action": "ban", "reason": "x"}) if url in POST_URLS else auth_client.get(url)
    assert response.status_code == 403


@pytest.mark.parametrize("url", GET_URLS)
def test_staff_see_every_page(mod_client, url):
    assert mod_client.get(url).status_code == 200


@pytest.mark.parametrize("url", POST_URLS)
def test_actions_refuse_get(mod_client, url):
    assert mod_client.get(url).status_code == 405


def test_actions_need_the_csrf_token(moderator):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(moderator)
    response = client.post(POST_URLS[0], {"action": "quarantine", "reason": "spam"})
    assert response.status_code == 403


# --- the queue ------------------------------------------------------------------------------------


def test_the_queue_shows_the_full_group_escaped(mod_client):
    g = group(5)
    nasty = f'<script>alert(1)</script><img src=x onerror="alert(2)"> & <b>bold</b> <answer>{g["answer"]}</answer>'
    (row,) = share(make_node(name="evil"), group(5, completions=[nasty, "<answer>no</answer>"]))
    response = mod_client.get(reverse("moderation:queue"), {"status": "any"})
    html = response.content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and "<b>bold</b>" not in html
    assert row.question.replace("<", "&lt;")[:40] in html or row.question[:40] in html
    assert "claimed 1.000 · verified 1.000" in html and "claimed 0.000 · verified 0.000" in html


def test_the_queue_defaults_to_held_groups_and_filters(mod_client):
    alice, bob = make_user(username="alice2"), make_user(username="bob2")
    a_node, b_node = make_node(owner=alice), make_node(owner=bob)
    a_rows = share(a_node, group(1), group(2))
    (b_row,) = share(b_node, group(3))
    forged = group(4)
    forged["rewards"] = [1.0] * 4
    (bad,) = share(b_node, forged)
    Rollout.objects.filter(id=a_rows[0].id).update(moderation_status=ModerationStatus.HELD, sampleable=False)

    def listed(**params) -> set[str]:
        response = mod_client.get(reverse("moderation:queue"), params)
        return {str(r.id) for r in response.context["page"].object_list}

    assert listed() == {str(a_rows[0].id)}  # the default view: held
    assert listed(status="any", contributor="bob2") == {str(b_row.id), str(bad.id)}
    assert listed(status="any", node=a_node.id) == {str(r.id) for r in a_rows}
    assert listed(status="any", reason="reward_mismatch") == {str(bad.id)}
    assert listed(status="any", reason="accepted", dataset="basic_arithmetic") == {str(r.id) for r in [*a_rows, b_row]}
    assert listed(status="any", since="2000-01-01T00:00", until="2001-01-01T00:00") == set()
    # by swarm: the groups of one swarm only
    other = make_swarm(slug="other")
    Rollout.objects.filter(id=b_row.id).update(swarm=other)
    assert listed(status="any", swarm="other") == {str(b_row.id)}
    assert listed(status="any", swarm=swarm_default_ensure().slug) == {str(r.id) for r in [*a_rows, bad]}


def test_the_queue_page_costs_a_fixed_number_of_queries(mod_client, django_assert_max_num_queries):
    nodes = [make_node() for _ in range(3)]
    for i, node in enumerate(nodes):
        share(node, group(10 + i))
    rules_current()  # the rules cache is warm in a running server

    def count_queries() -> int:
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as ctx:
            assert mod_client.get(reverse("moderation:queue"), {"status": "any"}).status_code == 200
        return len(ctx.captured_queries)

    few = count_queries()
    for i in range(6):
        share(make_node(), group(30 + i))
    assert count_queries() == few
    with django_assert_max_num_queries(6):  # session, user, count, page, flags (+ savepoint-free)
        mod_client.get(reverse("moderation:queue"), {"status": "any"})


def test_a_single_action_swaps_the_group_and_is_audited(mod_client, moderator):
    (row,) = share(make_node(), group(6))
    url = reverse("moderation:rollout_action", args=[row.id])
    response = htmx_post(mod_client, url, {"action": "quarantine", "reason": "looks copied"})
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="group-{row.id}"' in html and "Quarantined" in html and "<html" not in html
    row.refresh_from_db()
    assert row.moderation_status == ModerationStatus.QUARANTINED and not row.sampleable
    entry = AuditEntry.objects.get(action="quarantine")
    assert (entry.actor, entry.target_type, entry.target_id, entry.reason) == (
        moderator,
        "rollout",
        str(row.id),
        "looks copied",
    )

    htmx_post(mod_client, url, {"action": "restore", "reason": "false alarm"})
    row.refresh_from_db()
    assert row.moderation_status == ModerationStatus.OK and row.sampleable
    assert AuditEntry.objects.filter(action="restore", target_id=str(row.id), reason="false alarm").exists()


def test_an_action_needs_a_reason_and_a_known_action(mod_client):
    (row,) = share(make_node(), group(7))
    url = reverse("moderation:rollout_action", args=[row.id])
    response = htmx_post(mod_client, url, {"action": "quarantine", "reason": "  "})
    assert response.status_code == 400 and b"reason_required" in response.content
    assert response["HX-Retarget"] == "#moderation-errors"
    assert htmx_post(mod_client, url, {"action": "explode", "reason": "x"}).status_code == 400
    missing = reverse("moderation:rollout_action", args=[uuid.uuid4()])
    assert htmx_post(mod_client, missing, {"action": "reject", "reason": "x"}).status_code == 404
    row.refresh_from_db()
    assert row.moderation_status == ModerationStatus.OK
    assert not AuditEntry.objects.filter(actor__isnull=False).exists()


def test_bulk_quarantine_of_a_filter_takes_its_groups_out_of_sampling_and_restore_brings_them_back(mod_client):
    target, other, asker = make_node(), make_node(), make_node()
    targeted = share(target, *[group(i) for i in range(60, 66)])
    kept = share(other, *[group(i) for i in range(70, 73)])
    form = {"f-status": "ok", "f-node": str(target.id), "action": "quarantine"}

    preview = htmx_post(mod_client, reverse("moderation:bulk_preview"), form)
    assert preview.context["count"] == 6 and b"Confirm: quarantine 6" in preview.content

    done = htmx_post(mod_client, reverse("moderation:bulk_apply"), {**form, "reason": "copied", "expected": "6"})
    assert done.status_code == 200 and b"applied to 6 groups" in done.content
    assert Rollout.objects.filter(node=target, moderation_status="quarantined", sampleable=False).count() == 6
    entry = AuditEntry.objects.get(action="quarantine", target_type="rollout_filter")
    assert entry.count == 6 and entry.details["filter"]["node"] == str(target.id)

    drawn = set()
    for _ in range(5):
        drawn |= {g["id"] for g in sampled(asker, 20)}
    assert drawn == {str(r.id) for r in kept}

    restore = {"f-status": "quarantined", "f-node": str(target.id), "action": "restore", "reason": "appeal upheld"}
    htmx_post(mod_client, reverse("moderation:bulk_apply"), restore)
    drawn = {g["id"] for g in sampled(asker, 20)}
    assert drawn == {str(r.id) for r in [*targeted, *kept]}


def test_bulk_reject_requires_a_reason(mod_client):
    share(make_node(), group(80))
    response = htmx_post(
        mod_client, reverse("moderation:bulk_apply"), {"f-status": "any", "action": "reject", "reason": ""}
    )
    assert response.status_code == 400
    assert not Rollout.objects.filter(moderation_status="rejected").exists()


@pytest.mark.parametrize(
    "bad", [{"f-since": "tomorrow"}, {"f-node": "abc"}, {"f-until": "2026-13-45"}, {"f-status": "gone"}]
)
def test_a_bulk_action_on_an_invalid_filter_is_refused_and_changes_nothing(mod_client, bad):
    target, other = make_node(), make_node()
    share(target, group(100), group(101))
    share(other, group(102))
    # The moderator meant one node's groups since some date; one field is invalid.
    form = {"f-status": "ok", "f-node": str(target.id), "action": "quarantine", **bad}
    field = next(iter(bad))[2:]

    preview = htmx_post(mod_client, reverse("moderation:bulk_preview"), form)
    assert preview.status_code == 400
    html = preview.content.decode()
    assert 'data-code="invalid_filter"' in html and "The filter is invalid" in html
    assert preview["HX-Retarget"] == "#moderation-errors"
    assert "Confirm" not in html
    label = {"since": "Since", "node": "Node id", "until": "Until", "status": "Status"}[field]
    assert f"{label}: " in html

    done = htmx_post(mod_client, reverse("moderation:bulk_apply"), {**form, "reason": "copied", "expected": "2"})
    assert done.status_code == 400 and b"invalid_filter" in done.content
    assert set(Rollout.objects.values_list("moderation_status", flat=True)) == {ModerationStatus.OK}
    assert not AuditEntry.objects.filter(actor__isnull=False).exists()


def test_the_queue_page_shows_an_invalid_filter_as_an_error_and_lists_nothing(mod_client):
    share(make_node(), group(103), group(104))
    response = mod_client.get(reverse("moderation:queue"), {"status": "any", "since": "tomorrow"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "Enter a valid date/time." in html
    assert len(response.context["page"]) == 0 and "bulk_preview" not in html and "Apply to everything" not in html
    # The same filter without the bad field lists both groups and offers the bulk action.
    valid = mod_client.get(reverse("moderation:queue"), {"status": "any"})
    assert (
        valid.status_code == 200 and len(valid.context["page"]) == 2 and "Apply to everything" in valid.content.decode()
    )


@pytest.mark.parametrize(
    ("url", "params"), [("moderation:audit", {"since": "x"}), ("moderation:nodes", {"state": "x"})]
)
def test_other_pages_show_an_invalid_filter_as_an_error_and_list_nothing(mod_client, url, params):
    make_node()
    response = mod_client.get(reverse(url), params)
    assert response.status_code == 400 and len(response.context["page"]) == 0
    assert response.context["form"].errors


@pytest.mark.parametrize(
    ("referer", "expected"),
    [
        (None, "/moderation/"),
        ("https://evil.example/phish", "/moderation/"),
        ("//evil.example/phish", "/moderation/"),
        ("javascript:alert(1)", "/moderation/"),
        ("http://testserver/moderation/?status=ok&page=2", "http://testserver/moderation/?status=ok&page=2"),
    ],
)
def test_a_plain_form_action_goes_back_only_to_a_page_of_this_site(mod_client, referer, expected):
    (row,) = share(make_node(), group(105))
    headers = {"HTTP_REFERER": referer} if referer else {}
    url = reverse("moderation:rollout_action", args=[row.id])
    response = mod_client.post(url, {"action": "quarantine", "reason": "spam"}, **headers)
    assert response.status_code == 302 and response["Location"] == expected
    row.refresh_from_db()
    assert row.moderation_status == ModerationStatus.QUARANTINED


# --- nodes, rules, audit --------------------------------------------------------------------------


def test_node_page_bans_and_unbans_with_htmx(mod_client):
    node = make_node()
    rows = share(node, group(90), group(91))
    url = reverse("moderation:node_action", args=[node.id])
    response = htmx_post(mod_client, url, {"action": "ban", "reason": "forging rewards"})
    assert response.status_code == 200 and b"Unban node" in response.content
    node.refresh_from_db()
    assert node.banned_at is not None
    assert Rollout.objects.filter(node=node, moderation_status="quarantined").count() == 2
    assert AuditEntry.objects.get(action="ban_node").count == 2

    htmx_post(mod_client, url, {"action": "unban", "reason": "appeal"})
    node.refresh_from_db()
    assert node.banned_at is None
    assert {r.moderation_status for r in Rollout.objects.filter(id__in=[r.id for r in rows])} == {"ok"}


def test_staff_cannot_be_banned(mod_client, moderator):
    node = make_node(owner=staff("other-mod"))
    response = htmx_post(
        mod_client, reverse("moderation:node_action", args=[node.id]), {"action": "ban_contributor", "reason": "x"}
    )
    assert response.status_code == 409


def test_rules_page_validates_and_audits_changes(mod_client):
    url = reverse("moderation:rule_update", args=["length"])
    bad = htmx_post(mod_client, url, {"enabled": "on", "action": "hold", "params": '{"max_chars": -5}'})
    assert bad.status_code == 400 and b"max_chars" in bad.content
    bad_regex = htmx_post(
        mod_client,
        reverse("moderation:rule_update", args=["blocklist"]),
        {"enabled": "on", "action": "hold", "params": '{"patterns": ["(a+)+$"]}'},
    )
    assert bad_regex.status_code == 400 and b"nested repetition" in bad_regex.content
    ok = htmx_post(mod_client, url, {"action": "flag", "params": '{"max_chars": 100}'})
    assert ok.status_code == 200 and b"Saved." in ok.content
    rules_forget()
    rule = rules_current()["length"]
    assert (rule.enabled, rule.action, rule["max_chars"]) == (False, "flag", 100)
    entry = AuditEntry.objects.get(action="rule_change")
    assert entry.details["after"]["params"]["max_chars"] == 100


def test_the_audit_page_filters(mod_client, moderator):
    (row,) = share(make_node(), group(95))
    forged = group(96)
    forged["rewards"] = [0.0] * 4
    share(make_node(), forged)
    htmx_post(mod_client, reverse("moderation:rollout_action", args=[row.id]), {"action": "reject", "reason": "r"})

    def listed(**params) -> list[str]:
        response = mod_client.get(reverse("moderation:audit"), params)
        return [e.action for e in response.context["page"].object_list]

    assert sorted(listed()) == ["auto_verdict", "reject"]
    assert listed(actor="moderator") == ["reject"]
    assert listed(rule="verification") == ["auto_verdict"]
    assert listed(target_id=str(row.id)) == ["reject"]


def test_the_audit_log_is_append_only():
    (row,) = share(make_node(), group(97))
    from moderation.services import rollout_moderate

    rollout_moderate(actor=staff(), rollout_id=row.id, action="quarantine", reason="spam")
    entry = AuditEntry.objects.get(action="quarantine")
    entry.reason = "edited"
    with pytest.raises(PermissionError):
        entry.save()
    with pytest.raises(PermissionError):
        entry.delete()
    with pytest.raises(PermissionError):
        AuditEntry.objects.filter(id=entry.id).update(reason="edited")
    with pytest.raises(PermissionError):
        AuditEntry.objects.all().delete()
    from django.db import transaction

    for sql in ("UPDATE moderation_auditentry SET reason = 'x'", "DELETE FROM moderation_auditentry"):
        with pytest.raises(ProgrammingError) as exc, transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql)
        assert "append-only" in str(exc.value)
    assert AuditEntry.objects.get(id=entry.id).reason == "spam"


# --- the contributor's inbox ----------------------------------------------------------------------


def test_the_inbox_lists_out_of_pool_groups_with_their_reasons(user):
    from moderation.services import node_ban, rollout_moderate

    node = make_node(owner=user)
    forged = group(1)
    forged["rewards"] = [1.0] * 4
    bad, quarantined, rejected, fine = share(node, forged, group(2), group(3), group(4))
    mod = staff()
    rollout_moderate(actor=mod, rollout_id=quarantined.id, action="quarantine", reason="looks copied")
    rollout_moderate(actor=mod, rollout_id=rejected.id, action="reject", reason="gibberish")
    share(make_node(), group(5))  # someone else's

    entries = {e.rollout.id: e for e in rollout_inbox_list(owner=user)}
    assert set(entries) == {bad.id, quarantined.id, rejected.id}
    assert (entries[bad.id].state, entries[bad.id].code) == ("rejected", "reward_mismatch")
    assert "claimed reward differs" in entries[bad.id].reason
    assert (entries[quarantined.id].state, entries[quarantined.id].reason) == ("quarantined", "Moderator: looks copied")
    assert (entries[rejected.id].state, entries[rejected.id].code) == ("rejected", "moderator")
    assert ModerationDecision.objects.filter(rollout=rejected, actor=mod).exists()

    node_ban(actor=mod, node=node, reason="forging")
    states = {e.rollout.id: e.state for e in rollout_inbox_list(owner=user)}
    assert states[fine.id] == "quarantined"


def test_the_nodes_page_costs_a_fixed_number_of_queries(mod_client):
    from django.test.utils import CaptureQueriesContext

    def count_queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert mod_client.get(reverse("moderation:nodes")).status_code == 200
        return len(ctx.captured_queries)

    share(make_node(), group(1))
    rules_current()
    few = count_queries()
    for i in range(4):
        share(make_node(), group(2 + i))
    assert count_queries() == few


def test_every_moderation_model_is_in_the_admin():
    from django.apps import apps
    from django.contrib import admin

    for model in apps.get_app_config("moderation").get_models():
        assert model in admin.site._registry, model


def test_moderating_a_folded_group_moves_its_leaderboard_credit(moderator):
    from datetime import timedelta

    from django.utils import timezone

    from figures import stats
    from figures.models import NodeStats
    from moderation.services import node_ban, rollout_moderate

    node = make_node()
    old, other = share(node, group(1), group(2))
    Rollout.objects.filter(node=node).update(created_at=timezone.now() - timedelta(hours=1), audit_state="audited")
    stats.stats_fold()
    before = NodeStats.objects.get(node=node)
    rollout_moderate(actor=moderator, rollout_id=old.id, action="quarantine", reason="copied")
    after = NodeStats.objects.get(node=node)
    assert after.moderated_groups == before.moderated_groups + 1
    assert after.verified_reward == pytest.approx(before.verified_reward - sum(old.verified_rewards))
    node_ban(actor=moderator, node=node, reason="forging")  # the bulk path moves the rest
    assert NodeStats.objects.get(node=node).moderated_groups == before.moderated_groups + 2


def test_the_admin_pages_of_moderation_open_and_the_audit_log_is_read_only(client):
    from django.apps import apps

    from moderation.services import rollout_moderate

    admin_user = make_user(username="root", is_staff=True, is_superuser=True)
    (row,) = share(make_node(), group(3))
    rollout_moderate(actor=admin_user, rollout_id=row.id, action="quarantine", reason="spam")
    client.force_login(admin_user)
    for model in apps.get_app_config("moderation").get_models():
        url = f"/admin/moderation/{model._meta.model_name}/"
        assert client.get(url).status_code == 200, url
    entry = AuditEntry.objects.get(action="quarantine")
    assert client.get(f"/admin/moderation/auditentry/{entry.id}/delete/").status_code == 403
    assert client.get("/admin/moderation/auditentry/add/").status_code == 403
    response = client.post(
        "/admin/moderation/moderationrule/add/",
        {"key": "length", "enabled": "on", "action": "flag", "params": '{"max_chars": 0}'},
    )
    assert response.status_code == 200 and b"max_chars" in response.content  # refused, form shown again
