"""`make run`'s command, `manage.py sapo_local`, as a user starts it: the site and real node
processes on loopback, against a database of its own on the test run's PostgreSQL server."""

import io
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def scratch_database_url(django_db_setup):
    db = settings.DATABASES["default"]
    server = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}"
    name = f"sapo_local_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{server}/{name}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_make_run_serves_the_site_and_a_swarm_whose_groups_are_accepted(scratch_database_url, tmp_path, tiny_cache_dir):
    from sapo_node.tiny.cache import load_tiny, tiny_path

    # The site holds tiny-mini already (the test cache's build, as a `make run` before left it); the
    # nodes' cache is empty, so they download it from the site.
    load_tiny("tiny-mini", cache_dir=tiny_cache_dir, progress=False)
    built = tiny_path("tiny-mini", tiny_cache_dir)
    shutil.copytree(built, tmp_path / "models" / built.name)
    env = {
        **os.environ,
        "DATABASE_URL": scratch_database_url,
        "SAPO_CACHE": str(tmp_path / "node-cache"),
        "SAPO_PREBUILT_DIR": str(tmp_path / "models"),
        "SAPO_REDIS_PREFIX": f"sapolocal{uuid.uuid4().hex[:6]}",
        "SAPO_STATS_EXPORT_DIR": str(tmp_path / "stats"),  # its scheduled work writes the export
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "sapo_local",
            "--nodes",
            "2",
            "--models",
            "tiny-mini",
            "--rounds",
            "2",
            "--port",
            str(_free_port()),
            "--out",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "fold: ok" in out and "badges: ok" in out, out[-3000:]  # the scheduled jobs ran beside the site
    assert (tmp_path / "stats" / "index.json").is_file()
    for node in ("local-1", "local-2", "silo-1"):
        assert f"[{node}] round 2/2:" in out, out[-3000:]
        assert f"[{node}] round 3/" not in out
    # The log-in line names the interpreter as typed from the repository, and it runs as printed.
    printed = next(line for line in out.splitlines() if "changepassword demo" in line)
    assert "changepassword operator (staff" in printed
    python = printed.split("terminal: ", 1)[1].split(" manage.py", 1)[0]
    assert python != "python"
    ran = subprocess.run([python, "manage.py", "changepassword", "--help"], cwd=REPO, env=env, capture_output=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
    # the scheduled jobs ran beside the site, alerts among them, and the audits' worker
    assert "[jobs]   fold: ok" in out and "[jobs]   alerts: ok" in out, out[-3000:]
    assert "[audits] audit worker" in out, out[-3000:]
    # tiny-mini was published once and the nodes took it from the site, bitwise
    assert "[build tiny-mini] tiny-mini: " in out and "downloading tiny-mini: 3.7/3.7 MB" in out, out[-3000:]
    downloaded = tiny_path("tiny-mini", tmp_path / "node-cache")
    assert [(p.name, p.read_bytes()) for p in sorted(downloaded.iterdir())] == [
        (p.name, p.read_bytes()) for p in sorted(built.iterdir())
    ]

    with psycopg.connect(scratch_database_url) as conn:
        rows = conn.execute(
            "SELECT n.name, r.verdict, count(*) FROM pool_rollout r JOIN nodes_node n ON n.id = r.node_id "
            "GROUP BY n.name, r.verdict"
        ).fetchall()
        swarms = conn.execute(
            "SELECT s.slug, s.is_default, count(r.id) FROM swarms_swarm s LEFT JOIN pool_rollout r ON r.swarm_id = s.id"
            " GROUP BY s.slug, s.is_default"
        ).fetchall()
        audited = conn.execute(
            "SELECT DISTINCT n.name FROM audits_audit a JOIN nodes_node n ON n.id = a.node_id ORDER BY n.name"
        ).fetchall()
        arms = conn.execute(
            "SELECT n.name, (r.figures->>'external')::float FROM pool_noderound r JOIN nodes_node n ON n.id = r.node_id "
            "WHERE r.round = 2"
        ).fetchall()
    counts = {(name, verdict): n for name, verdict, n in rows}
    # Each node shared its own groups of both rounds (8 questions a round) and the server accepted them;
    # the silo node shares too, it only trains on none of the others' groups.
    assert counts == {("local-1", "accepted"): 16, ("local-2", "accepted"): 16, ("silo-1", "accepted"): 16}
    # Two swarms: the default one, which the local nodes joined, and the paper's, with no node.
    assert sorted(swarms) == [("main", True, 48), ("paper", False, 0)]
    # Every node's first weights are audited (a node's first digest always is).
    assert [name for (name,) in audited] == ["local-1", "local-2", "silo-1"]
    # and each reports its J: the swarm page's two arms
    assert dict(arms) == {"local-1": 4.0, "local-2": 4.0, "silo-1": 0.0}


def _cache_users(cache: Path) -> list[int]:
    """Pids of processes whose environment names `cache` as their SAPO_CACHE."""
    needle = f"SAPO_CACHE={cache}\0".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return pids


def test_ctrl_c_while_a_model_builds_stops_everything_quietly(scratch_database_url, tmp_path):
    cache = tmp_path / "cache"  # empty: the model is built from scratch
    env = {
        **os.environ,
        "DATABASE_URL": scratch_database_url,
        "SAPO_CACHE": str(cache),
        "SAPO_PREBUILT_DIR": str(tmp_path / "models"),
        "SAPO_REDIS_PREFIX": f"sapolocal{uuid.uuid4().hex[:6]}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "sapo_local",
            "--nodes",
            "2",
            "--models",
            "tiny-mini",
            "--port",
            str(_free_port()),
            "--out",
            str(tmp_path / "runs"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen = []
    deadline = time.monotonic() + 300
    try:
        while not any("[build tiny-mini] warm start tiny-mini: 0/150 step" in line for line in seen):
            assert time.monotonic() < deadline, "".join(seen)[-3000:]
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert proc.poll() is None, "".join(seen)[-3000:]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert "[build tiny-mini]" in out and "Node local-" not in out  # no node starts without its model
    # the builder is gone, and so are the helper processes the stopped ones leave (a multiprocessing
    # fork server ends when it reads its parent's end of file)
    deadline = time.monotonic() + 15
    while _cache_users(cache) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cache_users(cache) == []
    # and it left no model a later run could take for finished, in the site's folder or the nodes' cache
    assert list(cache.glob("*/build.json")) == [] and list((tmp_path / "models").glob("*/build.json")) == []


@pytest.mark.django_db
def test_make_run_opens_two_swarms_once_and_audits_them():
    from localswarm.management.commands.sapo_local import PAPER_SLUG, local_swarms

    from moderation.models import AuditEntry
    from sapo_node.tasks import CATALOGUES
    from swarms.models import Swarm
    from swarms.selectors import swarm_catalogue

    local = local_swarms(catalogue="easy")
    again = local_swarms(catalogue="easy")  # a second start changes nothing
    assert local.id == again.id and local.is_default
    assert sorted(Swarm.objects.values_list("slug", flat=True)) == sorted([local.slug, PAPER_SLUG])
    assert [e["dataset"] for e in swarm_catalogue(swarm=local).entries] == CATALOGUES["easy"].datasets
    paper = Swarm.objects.get(slug=PAPER_SLUG)
    assert [e["dataset"] for e in swarm_catalogue(swarm=paper).entries] == CATALOGUES["sapo"].datasets
    assert set(AuditEntry.objects.filter(target_type="swarm").values_list("actor__username", flat=True)) == {"operator"}


@pytest.mark.django_db
def test_a_local_node_started_with_another_model_is_a_new_node():
    from localswarm.management.commands.sapo_local import local_node

    from nodes.models import Node

    first, _ = local_node("local-1", "tiny-mini")
    again, _ = local_node("local-1", "tiny-mini")
    assert again.id == first.id  # a restart with the same model goes on with its node
    other, token = local_node("local-1", "smollm2-135m")
    assert other.id != first.id and (other.name, other.model_id) == ("local-1", "smollm2-135m") and token
    old = Node.objects.get(id=first.id)
    assert old.retired_at is not None and old.model_id == "tiny-mini"  # its figures stay with tiny-mini


def test_a_stopped_nodes_resume_hint_says_make_run_resumes_it(capsys):
    """A node's own hint names `sapo-node run --resume --server ... --out ...`; under make run the
    node is resumed by make run itself, so its line says that instead of a command to type."""
    from localswarm.management.commands.sapo_local import _pump

    node_output = io.StringIO(
        "round 3/10: reward 0.41\n"
        "stopped after round 3; continue with: sapo-node run --resume --server ws://127.0.0.1:8000/ws/node/ --out var/local-swarm/local-1\n"
    )
    _pump("[local-1]", node_output)
    out = capsys.readouterr().out
    assert out == "[local-1] round 3/10: reward 0.41\n[local-1] stopped after round 3; make run resumes it\n"


def test_make_runs_built_in_models_anchored_to_their_initial_policy():
    """make run's built-in nodes train with a KL penalty to the policy they started from, which keeps a
    tiny model out of the one-character runs the characters rule holds (docs/moderation.md, "Today's
    make run"); a real model keeps its own settings and the laptop's memory bounds."""
    from localswarm.management.commands.sapo_local import BUILT_IN_MODELS, model_flags

    from sapo_node.cli import build_parser, config_from_args

    def config(model):
        return config_from_args(build_parser().parse_args(["run", "--model", model, *model_flags(model)]))

    for model in BUILT_IN_MODELS:
        assert config(model).kl_coef == 0.1
    real = config("smollm2-135m")
    assert (real.kl_coef, real.max_new_tokens, real.micro_batch) == (0.0, 64, 4)


def test_make_run_gives_its_builds_and_nodes_the_cores_other_work_leaves_idle():
    """A build or a node's torch threads on a core another process uses spin-wait against it (2
    threads beside one busy core of 2: 3x slower), so make run divides the idle cores, not all of
    them, among the processes it starts, and gives each at least one."""
    from localswarm.management.commands.sapo_local import _threads

    from sapo_node.machine import Machine

    def machine(cores, load):
        return Machine(cores=cores, load=load, free_memory=8 << 30)

    assert _threads(1, machine(2, 0.1)) == "2"  # a quiet laptop: both cores to one build
    assert _threads(1, machine(2, 1.3)) == "1"  # one core busy elsewhere
    assert _threads(2, machine(2, 0.1)) == "1"
    assert _threads(3, machine(8, 0.5)) == "2"  # 7 idle cores among 3 nodes
    assert _threads(3, machine(8, 9.0)) == "1"  # none idle: still one each
