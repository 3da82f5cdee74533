"""The pool's texts age out by day partition (pool.retention) while the ledger, and so every figure,
stays: figures before and after are identical; groups inside a sampling window or under review keep
their texts; a run stopped halfway leaves the day whole and the next run finishes it; an archive that
cannot be written stops the day and /readyz says so; the day partitions exist ahead; the ingest's
idempotency holds across a day boundary; sampling reads the window's partitions only; migration 0008
moves a filled pool in and back without losing a group; migration 0011 partitions a filled ledger by
id and back, keeping every index, constraint and foreign key; the ledger's months are made ahead."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.checks import run_checks
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone
from factories import make_node, make_swarm, make_user
from psycopg import sql
from test_web_data import fresh_figures, make_consumption, make_group, make_report

from community.models import Badge
from community.services import team_found, team_join
from figures import stats
from figures.badges import badges_assign
from figures.export import stats_export
from moderation.services import rollout_moderate
from nodes.models import Node
from ops.scheduled import run_jobs
from pool import retention, sampling
from pool.models import Consumption, ModerationStatus, RetentionDay, Rollout, RolloutText, Verdict
from pool.selectors import window_id_floor
from swarms.models import Swarm
from swarms.services import swarm_default_ensure

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)
#: Days before yesterday noon (UTC) the filled pool's groups were shared: the first three are past the
#: 14 days' retention. From noon, a day's partition ends 12 hours after its groups whenever the test
#: runs, so which days age out does not depend on the time of day.
DAYS_AGO = (20, 17, 15, 5, 0)


def _base() -> datetime:
    return datetime.combine(timezone.now().astimezone(UTC).date() - DAY, datetime.min.time(), tzinfo=UTC) + DAY / 2


def _texts(ids) -> set[uuid.UUID]:
    return set(RolloutText.objects.filter(rollout_id__in=list(ids)).values_list("rollout_id", flat=True))


def _moved_into_days() -> None:
    """The filler writes past days' texts into the DEFAULT partition (their days were not made ahead):
    the job's first step makes those days and moves them in, as on a site where it ran every day."""
    retention.partitions_ensure()


@pytest.fixture
def filled_pool():
    """Two swarms, three contributors (two in a team) with two nodes each, groups over five days
    (accepted and rejected, one held and one quarantined among the old ones), reports and
    consumptions of old groups (helpfulness)."""
    base = _base()
    staff = make_user(is_staff=True)
    default, other = swarm_default_ensure(), make_swarm(actor=staff)
    users = [make_user() for _ in range(3)]
    team = team_found(founder=users[0], name="Old Hands", address="10.8.0.1")
    team_join(user=users[1], team=team)
    nodes = [make_node(owner=u) for u in users for _ in range(2)]
    groups: dict[int, list[Rollout]] = {}
    for days in DAYS_AGO:
        at = base - timedelta(days=days)
        rows = []
        for k, node in enumerate(nodes):
            swarm = default if k % 2 == 0 else other
            rows.append(make_group(node, rewards=(1.0, 0.0, 1.0), created_at=at, swarm=swarm))
            rows.append(make_group(node, rewards=(1.0, 1.0), created_at=at, swarm=swarm, dataset="gsm8k"))
            if k % 3 == 0:
                rows.append(
                    make_group(node, verdict=Verdict.REJECTED, reason="reward_mismatch", created_at=at, swarm=swarm)
                )
        groups[days] = rows
    held = make_group(nodes[0], created_at=base - timedelta(days=20), moderation_status=ModerationStatus.HELD)
    quarantined = make_group(
        nodes[1], created_at=base - timedelta(days=17), moderation_status=ModerationStatus.QUARANTINED
    )
    for days in (20, 15, 0):
        for k, rollout in enumerate(groups[days][:6]):
            make_consumption(nodes[(k + 1) % len(nodes)], rollout)
    for node in nodes:
        make_report(node)
    _moved_into_days()
    return {"groups": groups, "held": held, "quarantined": quarantined, "users": users, "nodes": nodes, "team": team}


def _figures(client, tmp_path: Path) -> dict:
    """Every figure a page or the API shows, as data: the API's figures of the leaderboard, the swarms,
    contributors, nodes, teams and the pool, the badges, the statistics export's files, and the
    leaderboard page. The aha groups' question (a text, not a figure) is set aside: it is None once
    the group's texts aged out (compared separately)."""
    fresh_figures()
    stats.stats_fold()
    badges_assign()
    out: dict = {}

    def get(url: str):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response.json()

    out["leaderboard"] = get("/api/v1/leaderboard/")
    out["leaderboard_7d"] = get("/api/v1/leaderboard/?period=7d")
    out["swarm"] = get("/api/v1/swarm/")
    out["swarms"] = get("/api/v1/swarms/")
    for swarm in Swarm.objects.order_by("id"):
        out[f"swarm {swarm.slug}"] = get(f"/api/v1/swarms/{swarm.slug}/")
    out["teams"] = get("/api/v1/teams/")
    for slug in sorted({team["slug"] for team in out["teams"]["results"]} if "results" in out["teams"] else []):
        out[f"team {slug}"] = get(f"/api/v1/teams/{slug}/")
    for node in Node.objects.order_by("id"):
        out[f"node {node.id}"] = get(f"/api/v1/public/nodes/{node.id}/")
        out[f"contributor {node.owner.username}"] = get(f"/api/v1/contributors/{node.owner.username}/")
    out["pool"] = get("/api/v1/pool/stats/")
    out["badges"] = sorted(Badge.objects.values_list("user_id", "team_id", "kind"), key=str)
    export = tmp_path / f"export-{len(list(tmp_path.glob('export-*')))}"
    stats_export(directory=export)
    for path in sorted(export.iterdir()):
        if path.suffix == ".gz":
            out[f"export {path.name}"] = gzip.decompress(path.read_bytes()).decode()
    page = client.get("/leaderboard/").content.decode()
    page = re.sub(r"updated \d\d:\d\d:\d\d UTC", "updated (when the figures were read)", page)
    out["leaderboard page"] = re.sub(r'"X-CSRFToken": "\w+"', "", page)
    return _without_aha_questions(out)


def _differences(a, b, path: str = "") -> list[str]:
    """Where two figure dumps differ (the path and both values), to the leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b), key=str)
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, str) and isinstance(b, str) and a != b and "\n" in a:
        lines = [(i, x, y) for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines(), strict=False)) if x != y]
        return [f"{path} line {i}: {x!r} != {y!r}" for i, x, y in lines[:5]] or [f"{path}: lengths differ"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _without_aha_questions(value):
    if isinstance(value, dict):
        return {k: _without_aha_questions(v) for k, v in value.items() if k != "question"}
    if isinstance(value, list):
        return [_without_aha_questions(v) for v in value]
    return value


def test_ageing_out_a_filled_pool_changes_no_figure_to_the_group(client, filled_pool, tmp_path, monkeypatch):
    groups = filled_pool["groups"]
    frozen = timezone.now()  # recent credit decays with the clock: both readings at one instant
    monkeypatch.setattr(timezone, "now", lambda: frozen)
    before = _figures(client, tmp_path)
    assert before["pool"]["groups"] == sum(len(rows) for rows in groups.values()) + 2
    result = retention.texts_age_out(directory=tmp_path / "archive")
    assert result.failed is None
    aged = {(_base() - timedelta(days=d)).date() for d in (20, 17, 15)}
    assert aged <= {r.day for r in result.dropped}  # (and any empty day partition as old)
    assert all(r.day < (timezone.now() - 14 * DAY).date() for r in result.dropped)
    after = _figures(client, tmp_path)
    assert after.keys() == before.keys()
    differences = _differences(before, after)
    assert differences == [], "\n".join(differences)
    old = [r.id for days in (20, 17, 15) for r in groups[days]]
    recent = [r.id for days in (5, 0) for r in groups[days]]
    assert _texts(old) == set() and _texts(recent) == set(recent)
    assert Rollout.objects.count() == before["pool"]["groups"]  # every ledger row stays
    # The archive has every aged-out group's texts (and its ledger columns), one file per day.
    archived = {}
    for path in sorted((tmp_path / "archive").glob("pool-texts-*.jsonl.gz")):
        for line in gzip.decompress(path.read_bytes()).decode().splitlines():
            record = json.loads(line)
            archived[uuid.UUID(record["id"])] = record
    assert set(old) <= set(archived) and not set(recent) & set(archived)
    sample = Rollout.objects.get(id=old[0])
    assert archived[old[0]]["completions"] == ["<answer>1.0</answer>", "<answer>0.0</answer>", "<answer>1.0</answer>"]
    assert archived[old[0]]["verified_rewards"] == sample.verified_rewards
    assert archived[old[0]]["node_id"] == sample.node_id


def test_retention_keeps_groups_under_review_and_inside_any_swarms_window(client, filled_pool, tmp_path):
    held, quarantined = filled_pool["held"], filled_pool["quarantined"]
    long_window = make_swarm(sample_window_seconds=18 * 86_400)  # longer than the 14 days' retention
    author, asker = make_node(), make_node()
    in_window = make_group(
        author, rewards=(1.0, 0.0), created_at=timezone.now() - timedelta(days=15), swarm=long_window
    )
    _moved_into_days()
    retention.texts_age_out(directory=tmp_path)
    # 18 days and a day are kept: the 20 days old groups go, the 17 days old stay (any swarm's).
    assert _texts([r.id for r in filled_pool["groups"][20]]) == set()
    assert _texts([r.id for r in filled_pool["groups"][17]]) == {r.id for r in filled_pool["groups"][17]}
    assert _texts([held.id, quarantined.id, in_window.id]) == {held.id, quarantined.id, in_window.id}
    drawn = sampling.rollout_sample(node=asker, n=1, window_seconds=18 * 86_400, swarm_id=long_window.id)
    assert [json.loads(text)["id"] for text in drawn.texts] == [str(in_window.id)]
    # Without the long window, the 17 days old day goes too; the quarantined group of it stays.
    Swarm.objects.filter(id=long_window.id).update(sample_window_seconds=None)
    retention.texts_age_out(directory=tmp_path)
    assert _texts([r.id for r in filled_pool["groups"][17]]) == set()
    assert _texts([held.id, quarantined.id]) == {held.id, quarantined.id}
    # The moderation queue shows the held group's texts, and an aged-out group says so with the date.
    moderator = make_user(is_staff=True)
    client.force_login(moderator)
    html = client.get(reverse("moderation:queue"), {"status": "any", "node": held.node_id}).content.decode()
    assert "What is 2 + 1?" in html
    gone = filled_pool["groups"][20][0]
    html = client.get(reverse("moderation:queue"), {"status": "any", "node": gone.node_id}).content.decode()
    assert f'Texts aged out on <time datetime="{timezone.now().astimezone(UTC):%Y-%m-%d}">' in html
    api = client.get(f"/api/v1/rollouts/{gone.id}/").json()
    assert api["texts_aged_out"] is True and api["question"] is None and api["completions"] is None
    assert api["verified_rewards"] == gone.verified_rewards
    # Once reviewed, the held group's texts go at the next run (they were archived with their day).
    rollout_moderate(actor=moderator, rollout_id=held.id, action="restore", reason="looked fine")
    retention.texts_age_out(directory=tmp_path)
    assert _texts([held.id, quarantined.id]) == {quarantined.id}


def test_a_run_stopped_halfway_leaves_the_day_whole_and_the_next_run_finishes_it(filled_pool, tmp_path, monkeypatch):
    old = [r.id for r in filled_pool["groups"][20]]
    day = (_base() - timedelta(days=20)).date()
    real_drop = retention._drop

    def killed(cursor, name):  # after the detach and the move of the kept rows, before the drop
        raise RuntimeError("killed")

    monkeypatch.setattr(retention, "_drop", killed)
    with pytest.raises(RuntimeError, match="killed"):
        retention.texts_age_out(directory=tmp_path)
    assert day in retention.day_partitions()
    assert _texts(old) == set(old)
    assert RolloutText.objects.filter(rollout_id=filled_pool["held"].id).count() == 1  # not twice
    assert not RetentionDay.objects.filter(dropped_at__isnull=False).exists()
    monkeypatch.setattr(retention, "_drop", real_drop)
    result = retention.texts_age_out(directory=tmp_path)
    assert [r.day for r in result.dropped][0] == day and result.failed is None
    assert day not in retention.day_partitions()
    assert _texts(old) == set()
    assert RolloutText.objects.filter(rollout_id=filled_pool["held"].id).count() == 1


def test_an_unwritable_archive_stops_the_day_and_readyz_says_so(client, filled_pool, tmp_path, settings):
    old = [r.id for r in filled_pool["groups"][20]]
    (tmp_path / "a-file").write_text("not a folder")
    result = retention.texts_age_out(directory=tmp_path / "a-file" / "archive")
    assert result.dropped == [] and result.failed is not None
    assert _texts(old) == set(old)  # nothing dropped that was not archived
    assert len(retention.day_partitions()) >= 8 + 3
    ready = client.get("/readyz").json()
    assert ready["ready"] is True and ready["retention"].startswith(f"stopped at {result.failed.day}: cannot write")
    settings.SAPO_ARCHIVE_DIR = str(tmp_path / "a-file" / "archive")
    (job,) = run_jobs(["retention"])  # the scheduled job reports the day as failed
    assert not job.ok and "cannot write the archive" in job.message
    assert _texts(old) == set(old)
    settings.SAPO_ARCHIVE_DIR = str(tmp_path / "archive")
    (job,) = run_jobs(["retention"])
    assert job.ok and _texts(old) == set()
    assert client.get("/readyz").json()["retention"] == "ok"


def test_without_an_archive_folder_an_aged_day_keeps_its_texts_unless_dropping_unarchived_is_allowed(
    filled_pool, settings
):
    old = [r.id for days in (20, 17, 15) for r in filled_pool["groups"][days]]
    recent = [r.id for days in (5, 0) for r in filled_pool["groups"][days]]
    aged = {(_base() - timedelta(days=d)).date() for d in (20, 17, 15)}
    settings.SAPO_ARCHIVE_DIR = ""
    (job,) = run_jobs(["retention"])
    assert job.ok, job.message
    assert _texts(old) == set(old) and aged <= set(retention.day_partitions())
    assert job.message.startswith("Texts past the retention are kept: no archive folder (SAPO_ARCHIVE_DIR")
    assert f"{len(aged)} days past the retention kept unarchived" in job.message
    assert not RetentionDay.objects.filter(dropped_at__isnull=False).exists() and retention.retention_errors() == []
    assert [w.id for w in run_checks(tags=["ops"]) if w.id == "ops.W005"] == ["ops.W005"]  # `manage.py check`
    # Told that texts may go unarchived, the job drops the days and records that no archive was written.
    settings.SAPO_RETENTION_UNARCHIVED = "drop"
    assert not [w for w in run_checks(tags=["ops"]) if w.id == "ops.W005"]
    (job,) = run_jobs(["retention"])
    assert job.ok and job.message.startswith("Texts past the retention are dropped without an archive")
    assert _texts(old) == set() and _texts(recent) == set(recent)
    assert {r.day: r.archive for r in RetentionDay.objects.filter(day__in=aged)} == dict.fromkeys(aged, "")
    held = filled_pool["held"]
    assert _texts([held.id, filled_pool["quarantined"].id]) == {held.id, filled_pool["quarantined"].id}


def test_the_review_s_texts_of_a_day_dropped_unarchived_go_only_when_dropping_unarchived_is_allowed(
    filled_pool, tmp_path
):
    held = filled_pool["held"]
    retention.texts_age_out(directory="", unarchived="drop")
    rollout_moderate(actor=make_user(is_staff=True), rollout_id=held.id, action="restore", reason="looked fine")
    retention.texts_age_out(directory=tmp_path)  # its day went without an archive: it stays
    assert _texts([held.id]) == {held.id}
    retention.texts_age_out(directory="", unarchived="drop")
    assert _texts([held.id]) == set()


def test_the_archive_is_whole_on_disk_and_its_folder_synced_before_the_day_is_dropped(
    filled_pool, tmp_path, monkeypatch
):
    folder = tmp_path / "new" / "archive"  # made by the run: its parents' entries are synced too
    events: list[tuple] = []
    real_fsync, real_drop = os.fsync, retention._drop

    def fsync(fd: int) -> None:
        real_fsync(fd)
        st = os.fstat(fd)
        events.append(("fsync", st.st_ino, stat.S_ISDIR(st.st_mode), st.st_size))

    def drop(cursor, name: str) -> None:
        events.append(("drop", name))
        real_drop(cursor, name)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(retention, "_drop", drop)
    result = retention.texts_age_out(directory=folder)
    assert result.failed is None and len(result.dropped) >= 3
    for record in result.dropped:
        path = retention.archive_path(folder, record.day)
        assert record.archive == str(path)
        assert len(gzip.decompress(path.read_bytes()).decode().splitlines()) == record.groups  # whole
        dropped_at = events.index(("drop", retention.partition_name(record.day)))
        (file_synced,) = [k for k, e in enumerate(events) if e[0] == "fsync" and e[1] == path.stat().st_ino]
        # The file was synced with every byte of it (the gzip trailer included), then its folder's entry.
        assert events[file_synced][2:] == (False, path.stat().st_size)
        folder_synced = [k for k, e in enumerate(events) if e[:3] == ("fsync", folder.stat().st_ino, True)]
        assert any(file_synced < k < dropped_at for k in folder_synced), events
    for made in (folder.parent, tmp_path):  # the new folders' own entries, before the first drop
        synced = [k for k, e in enumerate(events) if e[:3] == ("fsync", made.stat().st_ino, True)]
        assert synced and synced[0] < events.index(("drop", retention.partition_name(result.dropped[0].day)))


def test_settings_archive_under_the_var_dir_by_default_and_refuse_an_unclear_retention(tmp_path):
    code = "import config.settings as s; print(s.SAPO_ARCHIVE_DIR, s.SAPO_RETENTION_UNARCHIVED)"

    def settings_with(**env: str) -> subprocess.CompletedProcess:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SAPO_")}
        return subprocess.run(
            [sys.executable, "-c", code],
            env={**clean, "PYTHONPATH": "platform", "SAPO_VAR_DIR": str(tmp_path), **env},
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )

    default = settings_with()
    assert default.returncode == 0, default.stderr
    assert default.stdout.split() == [str(tmp_path / "archive"), "keep"]
    assert settings_with(SAPO_ARCHIVE_DIR="", SAPO_RETENTION_UNARCHIVED="drop").stdout.split() == ["drop"]
    for env, said in (
        ({"SAPO_RETENTION_UNARCHIVED": "yes"}, "SAPO_RETENTION_UNARCHIVED must be keep or drop"),
        ({"SAPO_RETENTION_UNARCHIVED": "drop"}, "SAPO_RETENTION_UNARCHIVED=drop needs SAPO_ARCHIVE_DIR empty"),
        ({"SAPO_ARCHIVE_DIR": "var/archive"}, "SAPO_ARCHIVE_DIR must be an absolute path or empty"),
    ):
        refused = settings_with(**env)
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr


def test_the_job_makes_the_day_partitions_ahead_and_todays_groups_go_into_today_s(settings, tmp_path):
    settings.SAPO_ARCHIVE_DIR = str(tmp_path)
    with connection.cursor() as cursor:  # as if the migration ran long ago: no day partition is left
        for name in retention.day_partitions().values():
            cursor.execute(f"DROP TABLE {name}")
        last = max(retention.ledger_partitions().items())[1]  # the last month ahead
        cursor.execute(f"ALTER TABLE pool_rollout DETACH PARTITION {last}")  # referenced: detached, then dropped
        cursor.execute(f"DROP TABLE {last}")
    node = make_node()
    early = make_group(node)  # today's, before the job made today: the DEFAULT partition takes it
    (result,) = run_jobs(["retention"])
    assert result.ok, result.message
    today = timezone.now().astimezone(UTC).date()
    assert {today + k * DAY for k in range(retention.AHEAD_DAYS + 1)} <= set(retention.day_partitions())
    month = today.replace(day=1)
    months = [month]
    for _ in range(retention.AHEAD_MONTHS):
        months.append((months[-1] + 32 * DAY).replace(day=1))
    assert set(months) <= set(retention.ledger_partitions())  # the ledger's months, made ahead too
    later = make_group(node)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rollout_id, tableoid::regclass::text FROM pool_rollouttext WHERE rollout_id = ANY(%s)",
            [[early.id, later.id]],
        )
        assert set(cursor.fetchall()) == {
            (early.id, retention.partition_name(today)),
            (later.id, retention.partition_name(today)),
        }


def test_the_same_id_shared_again_across_a_day_boundary_is_stored_once(monkeypatch):
    from support.moderation import group, share

    from pool import ingest_statement

    midnight = datetime.combine(timezone.now().astimezone(UTC).date() + DAY, datetime.min.time(), tzinfo=UTC)
    retention.partitions_ensure()
    node = make_node()
    g = group(3)
    for at in (midnight - timedelta(seconds=1), midnight + timedelta(seconds=1)):
        monkeypatch.setattr(ingest_statement.timezone, "now", lambda at=at: at)
        share(node, g)
    assert Rollout.objects.filter(id=g["id"]).count() == 1
    texts = list(RolloutText.objects.filter(rollout_id=g["id"]))
    assert len(texts) == 1 and texts[0].created_at == midnight - timedelta(seconds=1)
    assert texts[0].created_at == Rollout.objects.get(id=g["id"]).created_at


def test_sampling_reads_the_window_s_day_partitions_only():
    now = timezone.now()
    retention.partitions_ensure(now=now - 10 * DAY, ahead=0)
    old = retention.partition_name((now - 10 * DAY).astimezone(UTC).date())
    params = {
        "cutoff": now - DAY,
        "node": 0,
        "swarm": swarm_default_ensure().id,
        "k": 12,
        "id_floor": window_id_floor(now - DAY),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("EXPLAIN {}").format(sql.SQL(sampling._DRAW_TEXT)), params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert retention.partition_name(now.astimezone(UTC).date()) in plan
    assert old not in plan and "pool_rollouttext_default" in plan  # the DEFAULT one may hold any day


def test_settings_refuse_a_text_retention_not_longer_than_the_sampling_window():
    env = {**os.environ, "PYTHONPATH": "platform", "SAPO_TEXT_RETENTION_DAYS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='config.settings'; django.setup()",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode != 0 and "SAPO_TEXT_RETENTION_DAYS must be longer than the sampling window" in done.stderr


# Migration 0008 ------------------------------------------------------------------------------

BEFORE = [("pool", "0007_swarms")]


def _migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def _latest() -> list[tuple[str, str]]:
    """Every app's newest migration: going back also unapplied other apps' migrations that depend on the
    one gone back to (such as figures' table names), and the tests after this one need them all."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


_LEDGER = (
    "id, node_id, swarm_id, catalogue_version, round, dataset, seed, index, completion_count, claimed_rewards::text,"
    " verified_rewards::text, verdict, reason, moderation_status, has_variance, sampleable, sample_seq, created_at"
)


@pytest.mark.django_db(transaction=True)
def test_migration_0008_moves_a_filled_pool_in_and_back_without_losing_a_group():
    author = make_node()
    swarm_id = swarm_default_ensure().id
    _migrate(BEFORE)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
                    question, answer, completions, completion_count, claimed_rewards, verified_rewards, verdict,
                    reason, moderation_status, has_variance, sampleable, sample_seq, created_at)
                SELECT gen_random_uuid(), %(node)s, %(swarm)s, 1, 1, 'basic_arithmetic', 1, g, 'q' || g,
                       CASE WHEN g %% 7 = 0 THEN NULL ELSE 'a' || g END, jsonb_build_array('x' || g, 'y'), 2,
                       '[1, 0]', '[1, 0]', 'accepted', '', 'ok', true, true, g,
                       now() - make_interval(hours => g %% 500)
                FROM generate_series(1, 3000) AS g
                """,
                {"node": author.id, "swarm": swarm_id},
            )
            cursor.execute(f"SELECT {_LEDGER} FROM pool_rollout ORDER BY id")
            ledger = cursor.fetchall()
            cursor.execute("SELECT id, question, answer, completions::text FROM pool_rollout ORDER BY id")
            texts = cursor.fetchall()
        _migrate(_latest())
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {_LEDGER} FROM pool_rollout ORDER BY id")
            assert cursor.fetchall() == ledger
            cursor.execute(
                "SELECT t.rollout_id, t.question, t.answer, t.completions::text FROM pool_rollouttext t"
                " JOIN pool_rollout r ON r.id = t.rollout_id AND r.created_at = t.created_at ORDER BY 1"
            )
            assert cursor.fetchall() == texts
            cursor.execute("SELECT count(*) FROM pool_rollouttext_default")
            assert cursor.fetchone()[0] == 0  # every day had its partition made
        _migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, question, answer, completions::text FROM pool_rollout ORDER BY id")
            assert cursor.fetchall() == texts
    finally:
        _migrate(_latest())
    assert Rollout.objects.with_texts().filter(completions__isnull=False).count() == 3000


# Migration 0011 ------------------------------------------------------------------------------

BEFORE_LEDGER = [("pool", "0010_rollout_review_index")]
LEDGER_PARTITIONED = [("pool", "0011_ledger_partitions")]


def _partitions(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = %s::regclass ORDER BY 1",
            [table],
        )
        return [row[0] for row in cursor.fetchall()]


def _ledger_schema() -> dict:
    """The ledger's indexes, constraints and the foreign keys pointing at it, by name."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexrelid::regclass::text, replace(pg_get_indexdef(indexrelid), ' ON ONLY ', ' ON ')"
            " FROM pg_index WHERE indrelid = 'pool_rollout'::regclass"
        )
        indexes = dict(cursor.fetchall())
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = 'pool_rollout'::regclass OR (confrelid = 'pool_rollout'::regclass AND conparentid = 0)"
        )
        return {"indexes": indexes, "constraints": dict(cursor.fetchall())}


@pytest.mark.django_db(transaction=True)
def test_migration_0011_partitions_a_filled_ledger_by_id_and_back_without_losing_a_group():
    author, consumer = make_node(), make_node()
    swarm_id = swarm_default_ensure().id
    _migrate(BEFORE_LEDGER)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO pool_rollout (id, node_id, swarm_id, catalogue_version, round, dataset, seed, index,
                    completion_count, claimed_rewards, verified_rewards, verdict, reason, moderation_status,
                    has_variance, sampleable, sample_seq, created_at)
                SELECT gen_random_uuid(), %(node)s, %(swarm)s, 1, 1, 'basic_arithmetic', 1, g, 2, '[1, 0]',
                       '[1, 0]', 'accepted', '', CASE WHEN g %% 50 = 0 THEN 'held' ELSE 'ok' END, true,
                       g %% 50 <> 0, CASE WHEN g %% 50 <> 0 THEN g END, now() - make_interval(hours => g %% 2000)
                FROM generate_series(1, 3000) AS g;
                INSERT INTO pool_consumption (consumer_id, rollout_id, author_id, swarm_id, round, created_at)
                SELECT %(consumer)s, id, node_id, swarm_id, 1, created_at FROM pool_rollout WHERE index %% 7 = 0;
                """,
                {"node": author.id, "swarm": swarm_id, "consumer": consumer.id},
            )
            cursor.execute(f"SELECT {_LEDGER} FROM pool_rollout ORDER BY id")
            ledger = cursor.fetchall()
        schema = _ledger_schema()
        assert _partitions("pool_rollout") == []
        _migrate(LEDGER_PARTITIONED)  # 0011 itself: later migrations add indexes of their own
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {_LEDGER} FROM pool_rollout ORDER BY id")
            assert cursor.fetchall() == ledger
        assert _ledger_schema() == schema  # indexes (partial ones), CHECKs, foreign keys: same names, same definitions
        made = _partitions("pool_rollout")
        oldest = (timezone.now() - timedelta(hours=2000)).astimezone(UTC).date().replace(day=1)
        assert "pool_rollout_default" in made and retention.ledger_partition_name(oldest) in made
        assert len(made) >= 1 + 3 + 2  # the DEFAULT one, ~84 days of months, 2 ahead
        # The foreign keys hold on the partitioned ledger: a consumption of a missing group is refused.
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO pool_consumption (consumer_id, rollout_id, author_id, swarm_id, round, created_at)"
                " VALUES (%s, %s, %s, %s, 1, now())",
                [consumer.id, uuid.uuid4(), author.id, swarm_id],
            )
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        _migrate(BEFORE_LEDGER)
        assert _partitions("pool_rollout") == [] and _ledger_schema() == schema
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {_LEDGER} FROM pool_rollout ORDER BY id")
            assert cursor.fetchall() == ledger
    finally:
        _migrate(_latest())
    assert Rollout.objects.count() == 3000 and Consumption.objects.count() == 3000 // 7
    node = make_node()
    (again,) = [make_group(node)]
    assert Rollout.objects.filter(id=again.id).exists()


def test_a_month_made_late_takes_its_rows_from_the_default_partition_and_keeps_their_references():
    """A pool filled with ids of a month no partition was made for (the DEFAULT partition took them):
    making that month moves them in, the consumptions pointing at them stay valid."""
    node, consumer = make_node(), make_node()
    at = timezone.now() - timedelta(days=400)
    group = make_group(node, created_at=at)
    make_consumption(consumer, group)
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM pool_rollout WHERE id = %s", [group.id])
        assert cursor.fetchone()[0] == retention.LEDGER_DEFAULT
    month = at.astimezone(UTC).date().replace(day=1)
    assert retention.ledger_partition_name(month) in retention.ledger_partitions_ensure(since=month)
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM pool_rollout WHERE id = %s", [group.id])
        assert cursor.fetchone()[0] == retention.ledger_partition_name(month)
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred foreign keys, checked now
    assert Consumption.objects.filter(rollout_id=group.id).count() == 1
    assert retention.ledger_partitions_ensure(since=month) == []


def test_a_second_retention_run_at_once_does_nothing(settings):
    import psycopg

    settings.SAPO_ARCHIVE_DIR = ""
    params = connection.get_connection_params()
    other = psycopg.connect(**{k: v for k, v in params.items() if k in ("dbname", "host", "port", "user", "password")})
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [retention._LOCK_KEY])
        assert retention.retention_job() == "another retention run holds the lock: nothing done"
        other.execute("SELECT pg_advisory_unlock(%s)", [retention._LOCK_KEY])
        assert retention.retention_job().endswith("days aged out")
    finally:
        other.close()
