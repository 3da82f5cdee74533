"""Moderation rules of the site and of one swarm (docs/moderation.md, "Rules of a swarm"): the site's
rules screen the shares of every swarm; a swarm's own rules screen its shares besides, and no other
swarm's. Groups go through the pool's share path (verification, screening, the INSERT)."""

from __future__ import annotations

import uuid

import pytest
from django.urls import reverse
from factories import make_node, make_swarm
from support.moderation import group, set_rule, staff
from support.pool import SAPO, to_rollout_in

from common.errors import ApplicationError
from moderation.models import AuditEntry, ModerationFlag, ModerationRule
from moderation.rules import PER_SWARM_KEYS, rules_current, rules_forget, swarm_rules_current
from moderation.selectors import rule_list
from moderation.services import rule_update
from pool.ingest import rollout_share
from pool.ingest_statement import SwarmOfBatch
from pool.models import ModerationStatus, Rollout
from swarms.scope import SITE, Scope

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


@pytest.fixture
def swarms():
    return make_swarm(slug="alpha", catalogue="sapo"), make_swarm(slug="beta", catalogue="sapo")


def share_in(swarm, text: str, index: int) -> Rollout:
    """One group with `text` in a completion, shared by a fresh node into `swarm`; its stored row."""
    g = group(index)
    g = group(index, completions=[f"{text} <answer>{g['answer']}</answer>", "no", "no either", "still no"])
    rollout_share(
        node=make_node(),
        rollouts=[to_rollout_in(g)],
        catalogue=SAPO,
        swarm=SwarmOfBatch(swarm.id, swarm.catalogue_version),
    )
    return Rollout.objects.get(id=uuid.UUID(g["id"]))


def held_by(row: Rollout) -> list[tuple[str, int | None]]:
    """(rule, swarm of the rule) of each flag on the group, after checking that a flag means held."""
    row.refresh_from_db()
    flags = sorted((f.rule, f.data.get("swarm")) for f in ModerationFlag.objects.filter(rollout=row))
    assert (row.moderation_status == ModerationStatus.HELD) == bool(flags)
    assert row.sampleable == (not flags)
    return flags


def test_a_swarms_rule_screens_its_shares_only_and_a_site_rule_screens_every_swarms(swarms):
    alpha, beta = swarms
    set_rule("blocklist", scope=Scope.swarm(alpha.id), patterns=["casino"])
    set_rule("blocklist", scope=SITE, patterns=["lottery"])

    assert held_by(share_in(alpha, "casino tonight", 40)) == [("blocklist", alpha.id)]
    assert held_by(share_in(beta, "casino tonight", 41)) == []  # alpha's rule is not beta's
    assert held_by(share_in(alpha, "lottery win", 42)) == [("blocklist", None)]
    assert held_by(share_in(beta, "lottery win", 43)) == [("blocklist", None)]
    assert held_by(share_in(beta, "plain reasoning", 44)) == []


def test_a_swarms_length_rule_holds_what_the_sites_lets_through(swarms):
    alpha, beta = swarms
    set_rule("length", scope=Scope.swarm(alpha.id), max_chars=60)
    text = "a careful line of working, written out step by step. " * 2  # ~110 characters: the site allows it
    assert held_by(share_in(alpha, text, 50)) == [("length", alpha.id)]
    assert held_by(share_in(beta, text, 51)) == []


def test_a_swarms_rules_are_kept_apart_from_the_sites(swarms):
    alpha, _ = swarms
    set_rule("blocklist", scope=Scope.swarm(alpha.id), action="flag", patterns=["casino"])
    assert rules_current()["blocklist"].enabled is False  # the site's is untouched
    assert swarm_rules_current(alpha.id)["blocklist"]["patterns"] == ["casino"]
    with pytest.raises(Exception, match="site's only"):
        rule_update(actor=staff(), key="trust", enabled=True, action="hold", params={}, scope=Scope.swarm(alpha.id))
    assert not ModerationRule.objects.filter(key="trust", swarm=alpha).exists()
    # Switched off, it no longer applies.
    rule_update(
        actor=staff(),
        key="blocklist",
        enabled=False,
        action="flag",
        params={"patterns": ["casino"]},
        scope=Scope.swarm(alpha.id),
    )
    rules_forget()
    assert swarm_rules_current(alpha.id) == {}


def test_whose_rules_is_said_not_left_out(swarms):
    """No swarm (None) names neither the site's rules nor a swarm's: the scope is required, and a
    swarm id no swarm has is refused rather than read as the site's."""
    with pytest.raises(TypeError):
        rule_update(actor=staff(), key="blocklist", enabled=True, action="flag", params={}, scope=None)
    with pytest.raises(TypeError):
        rule_list(scope=None)
    with pytest.raises(ApplicationError) as missing:
        rule_update(actor=staff(), key="blocklist", enabled=True, action="flag", params={}, scope=Scope.swarm(10**6))
    assert missing.value.code == "unknown_swarm"
    assert not ModerationRule.objects.filter(key="blocklist", swarm__isnull=False).exists()
    assert [item["spec"].key for item in rule_list(scope=Scope.swarm(swarms[0].id))] == list(PER_SWARM_KEYS)


def test_the_rules_page_edits_a_swarms_rules(client, swarms):
    alpha, _ = swarms
    client.force_login(staff("moderator"))
    page = client.get(reverse("moderation:rules"), {"swarm": "alpha"})
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="rule-blocklist"' in body and 'id="rule-trust"' not in body  # the keys a swarm may have
    assert '<input type="hidden" name="swarm" value="alpha">' in body

    url = reverse("moderation:rule_update", args=["blocklist"])
    saved = client.post(
        url,
        {"swarm": "alpha", "enabled": "on", "action": "hold", "params": '{"patterns": ["casino"]}'},
        HTTP_HX_REQUEST="true",
    )
    assert saved.status_code == 200 and b"Saved." in saved.content
    row = ModerationRule.objects.get(key="blocklist", swarm=alpha)
    assert row.params["patterns"] == ["casino"] and row.enabled
    entry = AuditEntry.objects.get(action="rule_change", target_id="blocklist")
    assert entry.details["swarm"] == "alpha" and entry.details["after"]["params"]["patterns"] == ["casino"]
    assert not ModerationRule.objects.filter(key="blocklist", swarm=None).exists()  # the site's untouched

    site_only = client.post(
        reverse("moderation:rule_update", args=["trust"]), {"swarm": "alpha", "params": "{}"}, HTTP_HX_REQUEST="true"
    )
    assert site_only.status_code == 400
    unknown = client.post(url, {"swarm": "nowhere", "params": "{}"}, HTTP_HX_REQUEST="true")
    assert unknown.status_code == 404
    assert client.get(reverse("moderation:rules"), {"swarm": "nowhere"}).status_code == 404


def test_the_admin_adds_a_swarms_rule_and_refuses_a_key_no_swarm_may_have(client, swarms):
    from factories import make_user

    alpha, _ = swarms
    client.force_login(make_user(username="root", is_staff=True, is_superuser=True))
    form = {"key": "trust", "swarm": alpha.id, "enabled": "on", "action": "hold", "params": "{}"}
    refused = client.post("/admin/moderation/moderationrule/add/", form)
    assert refused.status_code == 200 and b"site&#x27;s only" in refused.content
    assert not ModerationRule.objects.filter(swarm=alpha).exists()
    form.update(key="blocklist", params='{"patterns": ["casino"]}')
    assert client.post("/admin/moderation/moderationrule/add/", form).status_code == 302
    row = ModerationRule.objects.get(swarm=alpha)
    assert (row.key, row.params["patterns"]) == ("blocklist", ["casino"])
    assert AuditEntry.objects.get(action="rule_change").details["swarm"] == "alpha"
    assert client.get(f"/admin/moderation/moderationrule/{row.pk}/change/").status_code == 200
