"""Figures per swarm and in total: two swarms with groups of the same contributors; the leaderboard's
per-swarm figures (page and API) and the /stats/ export's per-swarm rows add up to the totals, exactly,
whether the groups are folded or live, and after moderation moves folded credit."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.utils import timezone
from factories import make_node, make_swarm, make_user
from test_community_teams import found
from test_web_data import fresh_figures, make_consumption, make_group, make_report

from community.models import Membership
from community.services import team_join
from figures import export, stats
from pool.models import ModerationStatus, Verdict
from pool.services import rollout_set_moderation
from swarms.scope import SITE, Scope
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.django_db

FIGURES = ("accepted", "rejected", "helped", "rounds", "verified_reward", "completions")


@pytest.fixture(autouse=True)
def _fresh(settings, tmp_path):
    settings.SAPO_STATS_EXPORT_DIR = tmp_path / "stats"
    fresh_figures()
    yield
    fresh_figures()


@pytest.fixture
def two_swarms():
    """Alice runs a node in both swarms and one in the second only; Bob one node in both. Rewards are
    binary fractions, so every sum is exact in floating point whatever its order."""
    main = swarm_default_ensure()
    hard = make_swarm(slug="hard", title="Hard tasks")
    alice, bob = make_user(username="alice"), make_user(username="bob")
    both, only_hard, bobs = (
        make_node(owner=alice, name="both"),
        make_node(owner=alice, name="only-hard"),
        make_node(owner=bob, name="bobs"),
    )
    old = timezone.now() - timedelta(hours=3)
    groups = {
        "main-old": make_group(both, rewards=(1.0, 0.5), created_at=old, swarm=main),
        "hard-old": make_group(both, rewards=(0.25, 0.25, 1.0), created_at=old, swarm=hard),
        "hard-old-2": make_group(only_hard, rewards=(1.0, 1.0), created_at=old, swarm=hard),
        "bob-main-old": make_group(bobs, rewards=(0.5, 0.0), created_at=old, swarm=main),
    }
    make_group(bobs, rewards=(1.0, 0.0), created_at=old, swarm=hard, verdict=Verdict.REJECTED)
    make_group(both, rewards=(1.0, 1.0), created_at=old, swarm=hard, moderation_status=ModerationStatus.QUARANTINED)
    make_consumption(bobs, groups["main-old"])
    make_consumption(only_hard, groups["hard-old"])
    make_report(both, round=1, swarm=main)
    make_report(both, round=2, swarm=hard)
    stats.stats_fold()
    # Live rows, newer than the fold.
    groups["main-live"] = make_group(both, rewards=(0.5, 0.5), swarm=main)
    groups["bob-hard-live"] = make_group(bobs, rewards=(0.125, 1.0), swarm=hard)
    make_consumption(both, groups["bob-hard-live"])
    return {"main": main, "hard": hard, "alice": alice, "bob": bob, "groups": groups}


def _board(client, view: str, swarm: str | None = None) -> dict[int, dict]:
    fresh_figures()
    query = {"view": view, **({"swarm": swarm} if swarm else {})}
    body = client.get("/api/v1/leaderboard/", query).json()
    assert body["swarm"] == swarm
    key = "contributor" if view == "contributors" else "node_id"
    rows = body[view]
    assert len(rows) == body["total"]
    return {row[key]: row for row in rows}


def _assert_swarms_sum_to_total(client, view: str, swarms: list[str]) -> dict[str, dict]:
    total = _board(client, view)
    per_swarm = {slug: _board(client, view, slug) for slug in swarms}
    assert set().union(*(set(rows) for rows in per_swarm.values())) == set(total)
    for key, row in total.items():
        for figure in FIGURES:
            if figure not in row:
                continue
            parts = [rows[key][figure] for rows in per_swarm.values() if key in rows]
            assert sum(parts) == row[figure], (view, key, figure)
        assert sum(rows[key]["recent_credit"] for rows in per_swarm.values() if key in rows) == pytest.approx(
            row["recent_credit"]
        )
    return {"total": total, **per_swarm}


def test_per_swarm_leaderboard_figures_sum_to_the_totals(client, two_swarms):
    main, hard = two_swarms["main"].slug, two_swarms["hard"].slug
    nodes = _assert_swarms_sum_to_total(client, "nodes", [main, hard])
    by_name = {slug: {r["name"]: r for r in rows.values()} for slug, rows in nodes.items()}
    # Each swarm counts its own groups only: the node in both swarms, folded and live.
    assert by_name[main]["both"]["verified_reward"] == 1.5 + 1.0
    assert by_name[hard]["both"]["verified_reward"] == 1.5
    assert by_name[hard]["both"]["accepted"] == 2  # the quarantined group is accepted, not credited
    assert by_name["total"]["both"]["rounds"] == 2 and by_name[hard]["both"]["rounds"] == 1
    assert "only-hard" not in by_name[main]
    # Bob's only group in the hard swarm the verifier rejected before the fold: his row there keeps it.
    assert by_name[hard]["bobs"]["rejected"] == 1
    assert by_name[hard]["bobs"]["helped"] == 1 and by_name[main]["bobs"]["helped"] == 0

    contributors = _assert_swarms_sum_to_total(client, "contributors", [main, hard])
    alice = two_swarms["alice"].public_name
    assert contributors[hard][alice]["nodes"] == 2 and contributors[main][alice]["nodes"] == 1

    # Moderation moves folded credit in the swarm and in the total alike.
    rollout_set_moderation(rollouts=[two_swarms["groups"]["hard-old"].id], status=ModerationStatus.QUARANTINED)
    after = _assert_swarms_sum_to_total(client, "nodes", [main, hard])
    assert {r["name"]: r for r in after[hard].values()}["both"]["verified_reward"] == 0.0


def test_the_leaderboard_page_has_a_swarm_selector_and_answers_404_for_an_unknown_swarm(client, two_swarms):
    page = client.get("/leaderboard/", {"view": "nodes", "swarm": "hard"}).content.decode()
    assert 'id="swarm-picker"' in page
    assert 'href="?view=nodes&amp;swarm=hard" data-swarm="hard" aria-current="page"' in page
    assert '<strong id="board-swarm">Hard tasks</strong>' in page
    assert "only-hard" in page
    assert "only-hard" not in client.get("/leaderboard/", {"view": "nodes", "swarm": "main"}).content.decode()
    # The table the page polls keeps the swarm.
    table = client.get("/leaderboard/table/", {"view": "nodes", "swarm": "hard"}).content.decode()
    assert "swarm=hard" in table and "only-hard" in table
    assert client.get("/leaderboard/", {"swarm": "nope"}).status_code == 404
    assert client.get("/api/v1/leaderboard/", {"swarm": "nope"}).status_code == 404


def _stats_file(client, name: str) -> dict:
    response = client.get(f"/stats/{name}")
    assert response.status_code == 200
    return json.loads(gzip.decompress(b"".join(response.streaming_content)))


def test_the_stats_export_has_per_swarm_rows_that_sum_to_the_totals(client, two_swarms):
    export.stats_export()
    for table, swarm_table, key in (
        ("contributors", "contributor_swarms", "contributor_id"),
        ("nodes", "node_swarms", "node_id"),
    ):
        totals = {r["id"]: r for r in _stats_file(client, f"{table}.json.gz")["rows"]}
        body = _stats_file(client, f"{swarm_table}.json.gz")
        assert body["columns"] == export.COLUMNS[swarm_table]
        rows = body["rows"]
        assert {r["swarm"] for r in rows} == {"main", "hard"}
        assert {r[key] for r in rows} == set(totals)
        for subject, total in totals.items():
            mine = [r for r in rows if r[key] == subject]
            for figure in ("accepted", "rejected", "helped", "verified_reward"):
                assert sum(r[figure] for r in mine) == total[figure], (table, subject, figure)
    # A contributor who turns private leaves the per-swarm tables at once, as the others.
    alice = two_swarms["alice"]
    alice.profile_private = True
    alice.save(update_fields=["profile_private"])
    export.export_withdraw(user_id=alice.id)
    for swarm_table in ("contributor_swarms", "node_swarms"):
        assert alice.id not in {r["contributor_id"] for r in _stats_file(client, f"{swarm_table}.json.gz")["rows"]}


def test_public_pages_show_each_swarm_and_the_rows_add_up(client, two_swarms):
    body = client.get("/api/v1/contributors/alice/").json()
    rows = {r["swarm"]: r for r in body["swarms"]}
    assert set(rows) == {"main", "hard"}
    for figure in ("accepted", "rejected", "helped", "verified_reward"):
        assert sum(r[figure] for r in rows.values()) == body[figure], figure
    assert rows["hard"]["verified_reward"] == 1.5 + 2.0 and rows["main"]["verified_reward"] == 2.5
    page = client.get("/contributors/alice/").content.decode()
    assert 'id="profile-swarms"' in page and 'data-swarm="hard"' in page
    # A node in one swarm: one row, no table on its page.
    only_hard = two_swarms["groups"]["hard-old-2"].node_id
    node = client.get(f"/api/v1/public/nodes/{only_hard}/").json()
    assert [r["swarm"] for r in node["swarms"]] == ["hard"]
    assert 'id="profile-swarms"' not in client.get(f"/nodes/{only_hard}/").content.decode()


def test_team_figures_per_swarm_sum_to_the_totals_exact_to_the_group(client, two_swarms):
    alice, bob = two_swarms["alice"], two_swarms["bob"]
    team = found(bob, "Night Owls")
    team_join(user=alice, team=team)
    old = two_swarms["groups"]["main-old"].created_at
    Membership.objects.filter(user=bob).update(joined_at=timezone.now() - timedelta(days=1))
    # Alice joined a minute after her folded groups: they are not the team's; her live group is.
    Membership.objects.filter(user=alice).update(joined_at=old + timedelta(minutes=1))
    fresh_figures()

    def figures(swarm: str | None) -> dict:
        fresh_figures()
        query = {"swarm": swarm} if swarm else {}
        listed = {t["slug"]: t for t in client.get("/api/v1/teams/", query).json()}
        detail = client.get(f"/api/v1/teams/{team.slug}/", query).json()
        assert detail["swarm"] == swarm
        assert detail["figures"]["verified_reward"] == listed[team.slug]["verified_reward"]
        return detail

    total, main, hard = figures(None), figures("main"), figures("hard")
    assert total["figures"]["verified_reward"] == 1.0 + 0.5 + 1.125
    assert (main["figures"]["verified_reward"], hard["figures"]["verified_reward"]) == (1.5, 1.125)
    for figure in ("accepted", "verified_reward"):
        assert main["figures"][figure] + hard["figures"][figure] == total["figures"][figure], figure
    assert main["figures"]["recent_credit"] + hard["figures"]["recent_credit"] == pytest.approx(
        total["figures"]["recent_credit"]
    )
    members = {m["contributor"]: m for m in total["members"]}
    for name, mine in members.items():
        parts = [{m["contributor"]: m for m in d["members"]}[name]["verified_reward"] for d in (main, hard)]
        assert sum(parts) == mine["verified_reward"], name
    board = client.get("/api/v1/leaderboard/", {"view": "teams", "swarm": "hard"}).json()
    assert board["swarm"] == "hard" and board["teams"][0]["verified_reward"] == 1.125
    page = client.get(f"/teams/{team.slug}/", {"swarm": "hard"}).content.decode()
    assert '<strong id="team-swarm">Hard tasks</strong>' in page
    assert f"/api/v1/teams/{team.slug}/?swarm=hard" in page
    assert client.get(f"/teams/{team.slug}/", {"swarm": "nope"}).status_code == 404
    listing = client.get("/teams/", {"swarm": "hard", "sort": "accepted"}).content.decode()
    assert '<strong id="teams-swarm">Hard tasks</strong>' in listing and "swarm=hard&sort=" in listing


def test_rank_badges_are_earned_per_swarm_too(client):
    from community.models import Badge
    from figures.badges import badges_assign
    from figures.leaderboard import leaderboard

    main, hard = swarm_default_ensure(), make_swarm(slug="hard", title="Hard tasks")
    alice, bob = make_user(username="alice"), make_user(username="bob")
    type(alice).objects.filter(id__in=[alice.id, bob.id]).update(date_joined=timezone.now() - timedelta(days=30))
    alices, bobs = make_node(owner=alice), make_node(owner=bob)
    for _ in range(15):
        make_group(alices, rewards=(1.0, 1.0), swarm=main)
    for _ in range(13):
        make_group(bobs, rewards=(1.0, 1.0), swarm=hard)
    fresh_figures()
    badges_assign()
    ranks = {(b.user_id, b.swarm_id): b.kind for b in Badge.objects.filter(kind__startswith="top", user__isnull=False)}
    # On the whole site Alice leads; each leads the swarm they worked in.
    assert ranks == {(alice.id, None): "top1", (alice.id, main.id): "top1", (bob.id, hard.id): "top1"}
    fresh_figures()
    rows = {r.owner_id: r.badges for r in leaderboard(scope=Scope.swarm(hard.id)).page.object_list}
    assert rows == {bob.id: ["top1"]}
    assert "top1" not in {r.owner_id: r.badges for r in leaderboard(scope=SITE).page.object_list}[bob.id]
    assert "Top 1%" in client.get("/leaderboard/", {"swarm": "hard"}).content.decode()
