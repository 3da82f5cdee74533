"""JSON from people and browsers is parsed with its nesting bounded (common.json_input): the staff
swarm form's catalogue, the moderation rules' parameters (their page and the admin's form) and every
DRF JSON body answer a nested document with a clear 400 or form error, never a 500, and store
nothing."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse
from factories import make_user

from common.json_input import MAX_JSON_DEPTH, JSONInputError, json_loads_bounded
from moderation.admin import ModerationRuleForm
from moderation.models import ModerationRule
from nodes.models import Node
from swarms.models import Swarm

pytestmark = pytest.mark.django_db

#: Far past Python's recursion limit: json.loads raises RecursionError on it.
ABYSS = "[" * 100_000 + "]" * 100_000
#: One level past the bound: parses, and is refused all the same.
JUST_TOO_DEEP = '{"a": ' * (MAX_JSON_DEPTH + 1) + "1" + "}" * (MAX_JSON_DEPTH + 1)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_the_bound_takes_what_the_site_needs_and_refuses_deeper_with_its_reason():
    assert json_loads_bounded('[{"dataset": "bf", "config": {"sizes": [[1, 2]]}}]')[0]["config"] == {"sizes": [[1, 2]]}
    assert json_loads_bounded(nested(MAX_JSON_DEPTH)) is not None
    assert json_loads_bounded("3") == 3
    for text in (ABYSS, JUST_TOO_DEEP, nested(MAX_JSON_DEPTH + 1)):
        with pytest.raises(JSONInputError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            json_loads_bounded(text)
    with pytest.raises(JSONInputError, match="not JSON"):
        json_loads_bounded("{")


@pytest.mark.parametrize("body", [ABYSS, JUST_TOO_DEEP], ids=["abyss", "one-too-deep"])
def test_a_drf_json_body_nested_too_deep_is_a_400_with_its_code(api_client, user, body):
    response = api_client.post("/api/v1/nodes/", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in response.json()["detail"]
    assert not Node.objects.filter(owner=user).exists()


@pytest.mark.parametrize("entries", [ABYSS, "[" + JUST_TOO_DEEP + "]"], ids=["abyss", "one-too-deep"])
def test_the_staff_swarm_form_refuses_a_nested_catalogue_with_the_field_named(client, entries):
    client.force_login(make_user(is_staff=True))
    response = client.post("/swarms/new/", {"slug": "deep", "title": "Deep", "entries": entries})
    assert response.status_code == 400
    assert "nested deeper than" in response.content.decode()
    assert not Swarm.objects.filter(slug="deep").exists()


@pytest.mark.parametrize("params", [ABYSS, JUST_TOO_DEEP], ids=["abyss", "one-too-deep"])
def test_the_rules_page_refuses_nested_parameters(client, params):
    client.force_login(make_user(is_staff=True))
    url = reverse("moderation:rule_update", args=["blocklist"])
    response = client.post(url, {"enabled": "on", "action": "hold", "params": params}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "nested deeper than" in response.content.decode()
    assert not ModerationRule.objects.filter(key="blocklist").exists()


def test_the_admins_rule_form_refuses_nested_parameters():
    form = ModerationRuleForm(data={"key": "blocklist", "enabled": "on", "action": "hold", "params": ABYSS})
    assert not form.is_valid()
    assert "nested deeper than" in " ".join(form.errors["params"])
    ok = ModerationRuleForm(
        data={"key": "blocklist", "enabled": "on", "action": "hold", "params": json.dumps({"patterns": ["spam"]})}
    )
    assert ok.is_valid(), ok.errors
