"""The daily statistics export: files per table and format, written by the scheduled job and the
management command, served as files at /stats/ with their documented columns."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from factories import make_node, make_user
from test_community_teams import found
from test_web_data import fresh_figures, make_group

from community.models import Membership
from figures import export, stats

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _export_dir(settings, tmp_path):
    settings.SAPO_STATS_EXPORT_DIR = tmp_path / "stats"
    fresh_figures()
    yield tmp_path / "stats"
    fresh_figures()


@pytest.fixture
def swarm(user, other_user):
    team = found(user, "Night Owls")
    Membership.objects.filter(user=user).update(joined_at=timezone.now() - timedelta(days=1))
    node = make_node(owner=user, name="laptop", model_id="=cmd|' /C calc'!A0", hardware="cpu x2")
    make_group(node, rewards=(1.0, 1.0), created_at=timezone.now() - timedelta(hours=2))
    make_group(make_node(owner=other_user, name="desk"))
    private = make_user(username="carol", profile_private=True)
    make_group(make_node(owner=private, name="hidden"))
    stats.stats_fold()
    return {"team": team, "node": node, "private": private}


def _read(directory, name):
    data = gzip.decompress((directory / name).read_bytes()).decode("utf-8")
    return json.loads(data) if name.endswith(".json.gz") else list(csv.reader(io.StringIO(data)))


def test_the_command_writes_every_file_with_the_documented_columns(swarm, user, other_user, _export_dir, capsys):
    call_command("sapo_stats", "export")
    assert "contributors.json.gz: 2 rows" in capsys.readouterr().out
    assert sorted(p.name for p in _export_dir.iterdir()) == sorted([*export.FILES, "index.json"])

    contributors = _read(_export_dir, "contributors.json.gz")
    assert contributors["schema"] == 1 and contributors["columns"] == export.COLUMNS["contributors"]
    alice = {r["id"]: r for r in contributors["rows"]}[user.id]
    assert alice == {
        "id": user.id,
        "name": "Alice",
        "page": "/contributors/alice/",
        "team_id": swarm["team"].id,
        "verified_reward": 2.0,
        "recent_credit": alice["recent_credit"],
        "accepted": 1,
        "rejected": 0,
        "helped": 0,
        "nodes": 1,
        "badges": [],
        "last_seen_at": alice["last_seen_at"],
    }
    # A private profile is in no file; the other contributor is.
    ids = {r["id"] for r in contributors["rows"]}
    assert ids == {user.id, other_user.id}
    nodes = _read(_export_dir, "nodes.json.gz")["rows"]
    assert {r["contributor_id"] for r in nodes} == {user.id, other_user.id}
    teams = _read(_export_dir, "teams.json.gz")["rows"]
    assert [(t["slug"], t["members"], t["verified_reward"]) for t in teams] == [("night-owls", 1, 2.0)]

    header, *rows = _read(_export_dir, "nodes.csv.gz")
    assert header == export.COLUMNS["nodes"]
    laptop = next(r for r in rows if r[1] == "laptop")
    assert laptop[header.index("model_id")].startswith("'=")  # not a formula in a spreadsheet
    assert len(_read(_export_dir, "contributors.csv.gz")) == 3

    index = json.loads((_export_dir / "index.json").read_text())
    for f in index["files"]:
        assert f["sha256"] == hashlib.sha256((_export_dir / f["name"]).read_bytes()).hexdigest()


def test_the_scheduled_job_exports_once_a_day(swarm, capsys):
    call_command("sapo_scheduled", "--only", "export")
    assert "exported contributors.json.gz (2 rows)" in capsys.readouterr().out
    first = export.export_index()
    call_command("sapo_scheduled", "--only", "export")
    assert "is fresh" in capsys.readouterr().out
    assert export.export_index().generated_at == first.generated_at
    export.stats_export(now=timezone.now() - timedelta(hours=25))  # as if the last one were a day old
    call_command("sapo_scheduled", "--only", "export")
    assert "exported" in capsys.readouterr().out


def test_stats_serves_the_files_without_touching_the_database(client, swarm, django_assert_num_queries):
    assert "No export yet" in client.get("/stats/").content.decode()
    export.stats_export()
    with django_assert_num_queries(0):
        page = client.get("/stats/").content.decode()
    assert 'href="/stats/contributors.csv.gz"' in page and "last_seen_at" in page
    with django_assert_num_queries(0):
        response = client.get("/stats/teams.json.gz")
        body = b"".join(response.streaming_content)
    assert response["Content-Type"] == "application/gzip"
    assert "attachment" in response["Content-Disposition"]
    assert json.loads(gzip.decompress(body))["table"] == "teams"
    index = client.get("/stats/index.json")
    assert json.loads(b"".join(index.streaming_content))["schema"] == 1
    for bad in ("/stats/secret_key", "/stats/..%2Fsecret_key", "/stats/users.json.gz"):
        assert client.get(bad).status_code == 404, bad
