"""The staff rules page edits each rule through a form of its own kind: a field per parameter (whole
numbers, shares, switches, a pattern a line) with its bounds and help, refused field by field with
nothing stored; the JSON a script posts (enabled, action, params) keeps working."""

from __future__ import annotations

import pytest
from django.urls import reverse
from support.moderation import staff

from moderation.models import AuditEntry, ModerationRule
from moderation.rules import RULES, rules_current, rules_forget

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_rules():
    rules_forget()
    yield
    rules_forget()


@pytest.fixture
def mod_client(client):
    client.force_login(staff("moderator"))
    return client


def _post(client, key: str, data: dict):
    return client.post(reverse("moderation:rule_update", args=[key]), data, HTTP_HX_REQUEST="true")


def test_each_rule_has_a_field_per_parameter_of_its_kind(mod_client):
    page = mod_client.get(reverse("moderation:rules")).content.decode()
    assert 'name="params"' not in page  # no raw JSON textarea
    # A whole number with its bounds, a share that takes decimals, a switch, a pattern list.
    assert 'type="number" name="length-max_chars" value="6000"' in page
    assert 'min="1"' in page and 'max="1000000"' in page
    assert 'name="characters-max_nonprintable_share" value="0.01" step="any"' in page
    assert 'type="checkbox" name="trust-sample_weighting"' in page
    assert '<textarea name="blocklist-patterns"' in page
    assert 'name="length-action"' in page and 'name="outlier-action"' not in page  # outlier only flags
    assert "Longest completion allowed. From 1 to 1,000,000." in page
    # Every rule's form has its own ids.
    for key in RULES:
        if RULES[key].params:
            assert f'id="id_{key}-' in page


def test_a_form_saves_typed_values_and_audits_them(mod_client):
    response = _post(
        mod_client,
        "characters",
        {
            "characters-enabled": "on",
            "characters-action": "flag",
            "characters-max_nonprintable_share": "0.05",
            "characters-max_non_ascii_share": "0.5",
            "characters-max_repeat_share": "0.6",
            "characters-min_chars_for_shares": "20",
        },
    )
    assert response.status_code == 200 and "Saved." in response.content.decode()
    rules_forget()
    rule = rules_current()["characters"]
    assert (rule.enabled, rule.action, rule["max_nonprintable_share"]) == (True, "flag", 0.05)
    patterns = _post(
        mod_client,
        "blocklist",
        {"blocklist-enabled": "on", "blocklist-action": "hold", "blocklist-patterns": "spam\r\n\r\n  buy now  \n"},
    )
    assert patterns.status_code == 200
    rules_forget()
    assert rules_current()["blocklist"]["patterns"] == ["spam", "buy now"]
    assert AuditEntry.objects.filter(action="rule_change").count() == 2


def test_a_bad_value_is_refused_by_its_field_and_nothing_is_stored(mod_client):
    response = _post(
        mod_client,
        "length",
        {"length-enabled": "on", "length-action": "hold", "length-max_chars": "-5"},
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "Not saved. Max chars: Ensure this value is greater than or equal to 1." in body
    assert 'value="-5"' in body  # what was typed stays in the form, beside its error
    assert not ModerationRule.objects.filter(key="length").exists()
    for data in (
        {"length-action": "delete", "length-max_chars": "10"},
        {"length-action": "hold", "length-max_chars": "ten"},
        {"length-action": "hold"},
    ):
        assert _post(mod_client, "length", data).status_code == 400
    unsafe = _post(
        mod_client, "blocklist", {"blocklist-enabled": "on", "blocklist-action": "hold", "blocklist-patterns": "(a+)+$"}
    )
    assert unsafe.status_code == 400 and "nested repetition" in unsafe.content.decode()
    assert not ModerationRule.objects.exists() and not AuditEntry.objects.exists()


def test_the_json_of_a_script_still_sets_a_rule(mod_client):
    response = _post(mod_client, "length", {"enabled": "on", "action": "flag", "params": '{"max_chars": 100}'})
    assert response.status_code == 200
    rules_forget()
    assert rules_current()["length"]["max_chars"] == 100
