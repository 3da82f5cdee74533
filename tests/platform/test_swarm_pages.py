"""The swarms' pages and API: `/swarms/` lists every swarm (retired ones too), `/swarms/<slug>/` is the
swarm page of one swarm only, `/swarm/` is the whole site's, and staff open, edit, pause and retire
swarms from their page (audited; bad input refused with the field named, nothing stored)."""

from __future__ import annotations

import json
import uuid

import pytest
from django.utils import timezone
from factories import make_node, make_swarm, make_user
from test_web_data import fresh_figures, make_group

from figures import stats
from moderation.models import AuditEntry
from nodes import presence
from sapo_node.tasks import CATALOGUES
from swarms.catalogue import entries_of_catalogue
from swarms.models import Swarm
from swarms.services import swarm_state_set

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    staff = make_user(is_staff=True)
    client.force_login(staff)
    client.staff = staff
    return client


def test_the_swarm_list_and_each_swarms_page_show_only_that_swarms_figures(client):
    easy, paper = make_swarm(slug="easy", catalogue="easy"), make_swarm(slug="paper", catalogue="sapo")
    node, other = make_node(), make_node()
    make_group(node, swarm=easy, dataset="base_conversion")
    make_group(other, swarm=paper, dataset="arc_1d")
    make_group(other, swarm=paper, dataset="arc_1d")
    stats.stats_fold()
    fresh_figures()
    listing = client.get("/swarms/")
    assert listing.status_code == 200
    for slug in ("easy", "paper"):
        assert f'id="swarm-{slug}"' in listing.content.decode()
    easy_api = client.get("/api/v1/swarms/easy/").json()
    paper_api = client.get("/api/v1/swarms/paper/").json()
    assert [a["dataset"] for a in easy_api["figures"]["accuracy"]] == ["base_conversion"]
    assert [a["dataset"] for a in paper_api["figures"]["accuracy"]] == ["arc_1d"]
    assert (easy_api["figures"]["accepted_groups"], paper_api["figures"]["accepted_groups"]) == (1, 2)
    assert easy_api["catalogue"][0]["dataset"] == CATALOGUES["easy"].datasets[0]
    whole = client.get("/api/v1/swarm/").json()  # the site: the sum of its swarms
    assert whole["accepted_groups"] == 3
    assert sorted(a["dataset"] for a in whole["accuracy"]) == ["arc_1d", "base_conversion"]
    page = client.get("/swarms/easy/").content.decode()
    assert "--swarm easy" in page and "/api/v1/swarms/easy/" in page and "/swarms/easy/figures/" in page
    assert client.get("/swarms/easy/figures/").status_code == 200
    assert client.get("/swarm/").status_code == 200
    assert client.get("/swarms/nope/").status_code == 404


def test_a_retired_swarm_keeps_its_page_and_its_figures(client):
    swarm = make_swarm(slug="old")
    make_group(make_node(), swarm=swarm, dataset="base_conversion")
    swarm_state_set(actor=make_user(is_staff=True), swarm=swarm, state="retired", reason="done")
    fresh_figures()
    assert "Retired" in client.get("/swarms/old/").content.decode()
    assert client.get("/api/v1/swarms/old/").json()["figures"]["accepted_groups"] == 1
    assert any(row["swarm"]["slug"] == "old" for row in client.get("/api/v1/swarms/").json())


def test_staff_open_a_swarm_from_its_page_and_the_change_is_audited(staff_client):
    entries = json.dumps(entries_of_catalogue(CATALOGUES["easy"]))
    response = staff_client.post(
        "/swarms/new/",
        {
            "slug": "cpu",
            "title": "CPU swarm",
            "description": "Small models",
            "entries": entries,
            "default_local": "4",
            "default_external": "4",
            "reason": "for laptops",
        },
    )
    assert response.status_code == 302 and response["Location"] == "/swarms/cpu/manage/"
    swarm = Swarm.objects.get(slug="cpu")
    assert swarm.title == "CPU swarm" and swarm.catalogue_version == 1
    response = staff_client.post("/swarms/cpu/manage/", {"action": "state", "state": "paused", "reason": "upgrade"})
    assert response.status_code == 302
    assert Swarm.objects.get(slug="cpu").state == "paused"
    assert list(AuditEntry.objects.filter(target_type="swarm").order_by("id").values_list("action", flat=True)) == [
        "swarm_create",
        "swarm_pause",
    ]


def test_a_bad_catalogue_on_the_staff_page_is_refused_with_the_field_named(staff_client):
    bad = json.dumps([{"dataset": "basic_arithmetic", "config": {"min_terms": "two"}}])
    response = staff_client.post("/swarms/new/", {"slug": "bad", "title": "Bad", "entries": bad})
    assert response.status_code == 400
    assert "entries[0].config" in response.content.decode()
    assert not Swarm.objects.filter(slug="bad").exists()
    assert staff_client.post("/swarms/new/", {"slug": "bad", "title": "Bad", "entries": "{"}).status_code == 400


def test_only_staff_reach_the_swarm_staff_pages(client):
    make_swarm(slug="easy")
    assert client.get("/swarms/new/").status_code == 302  # to the login page
    client.force_login(make_user())
    assert client.get("/swarms/new/").status_code == 403
    assert (
        client.post("/swarms/easy/manage/", {"action": "state", "state": "retired", "reason": "x"}).status_code == 403
    )
    assert Swarm.objects.get(slug="easy").state == "open"


def test_swarms_are_in_the_openapi_schema(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    assert "/api/v1/swarms/" in schema and "/api/v1/swarms/{slug}/" in schema


def test_a_swarms_nodes_online_are_the_nodes_whose_socket_is_in_it(client):
    """A node connected to one swarm counts online on that swarm's page only, and once on the site's."""
    easy, paper = make_swarm(slug="easy", catalogue="easy"), make_swarm(slug="paper", catalogue="sapo")
    node = make_node()
    make_group(node, swarm=paper, dataset="arc_1d")  # it shared in paper before it moved to easy
    node.last_seen_at = timezone.now()
    node.save(update_fields=["last_seen_at"])
    socket = uuid.uuid4()
    presence.connections_renew(connections={socket: node.id}, swarms={socket: easy.id})
    fresh_figures()
    online = {
        slug: client.get(f"/api/v1/swarms/{slug}/").json()["figures"]["nodes_online"] for slug in ("easy", "paper")
    }
    assert online == {"easy": 1, "paper": 0}
    assert client.get("/api/v1/swarm/").json()["nodes_online"] == 1
