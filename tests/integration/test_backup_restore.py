"""A backup restored under running nodes loses no group they hold (docs/deploy.md, "Backups and
restore"):

- bench/restore.py on its own PostgreSQL, asserted here with few nodes: `pg_restore --clean` into the
  same database (which keeps the cluster, its timeline and the database's OID), with a node
  registered after the backup (refused 4401 after the restore, then registered again);
- a node whose registration the restore lost, against the real platform: refused 4401 by the server
  that welcomed it, it says what to do and keeps its outbox; under a new token it sends everything
  again, the groups acknowledged before the restore too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from factories import make_node_with_token
from support.live_nodes import wait_for

from pool.models import EpochMarker, Rollout
from sapo_node.groups import Group
from sapo_node.tasks import EASY_CATALOGUE, TaskRef, build_entry, score_completion
from sapo_node.transport import Hello

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_every_acknowledged_group_is_back_after_pg_restore_clean_under_running_nodes() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    args = ["--nodes", "2", "--late", "1", "--before", "3", "--after", "6", "--method", "clean"]
    result = subprocess.run(
        [sys.executable, "bench/restore.py", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    out = result.stdout + result.stderr
    held = int(re.search(r"(\d+) groups acknowledged in all", out).group(1))
    lost = int(re.search(r"the database lacks (\d+) of them", out).group(1))
    assert held >= 24 and lost >= 18, out  # the restore did lose what came after the backup
    assert "the 1 late nodes were refused (4401)" in out, out[-3000:]
    assert "restored from a backup made before this node was registered" in out, out[-3000:]
    assert "once the nodes reconnected: 0 missing" in out, out[-3000:]
    assert result.returncode == 0, out[-3000:]


# ---------------------------------------------------------------------------- a node the restore forgot

HELLO = Hello("sapo-node/integration", "tiny", "cpu", 4, 4)


def honest_groups(n: int, seed: int) -> list[Group]:
    """n groups of basic_arithmetic the server accepts: one right completion, one wrong."""
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    assert spec is not None
    groups = []
    for index in range(n):
        entry = build_entry(spec, seed, index)
        completions = [f"so <answer>{entry['answer']}</answer>", "<answer>nope</answer>"]
        groups.append(
            Group.new(
                round=1,
                task=TaskRef(spec.dataset, seed, index),
                question=str(entry["question"]),
                answer=str(entry["answer"]),
                completions=completions,
                rewards=[score_completion(spec, seed, entry, c) for c in completions],
            )
        )
    return groups


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_a_node_the_restore_forgot_says_what_to_do_keeps_its_groups_and_sends_them_under_a_new_token(
    swarm_servers, transports, tmp_path, caplog
) -> None:
    node, token = make_node_with_token(name="registered-after-the-backup")
    outbox = tmp_path / "run" / "outbox.sqlite3"
    groups = honest_groups(5, seed=31)
    with swarm_servers() as first:
        port, url = first.port, first.ws_url + "/ws/node/"
        t = transports(url, token, outbox)
        t.start(HELLO)
        assert t.wait_connected(20)
        t.share(groups[:3])
        assert t.flush(30) and t.counts().accepted == 3

    # The site restored from a backup made before the node was registered: no node, no token, none of
    # its groups; the restore inserted the epoch marker again (same values, another transaction).
    node.delete()
    marker = EpochMarker.objects.get()
    marker.delete()
    EpochMarker.objects.create(id=marker.id, token=marker.token)
    t.share(groups[3:])  # the node trains on meanwhile

    with swarm_servers(port=port) as second:
        assert wait_for(lambda: t.status == "refused (4401)", timeout=30.0)
        advice = next(r.getMessage() for r in caplog.records if "4401" in r.getMessage())
        assert "restored from a backup made before this node was registered" in advice
        assert f"--out {outbox.parent} --server {url} --token NEW_TOKEN" in advice
        assert "keeps the 2 groups waiting for the server and the 3 it acknowledged" in advice
        assert (t.counts().accepted, t.counts().pending) == (3, 2)
        t.close()

        # Its owner registers it again; the node starts over on the same outbox with the new token.
        again, new_token = make_node_with_token(name="registered-again")
        t2 = transports(second.ws_url + "/ws/node/", new_token, outbox)
        t2.start(HELLO)
        assert t2.wait_connected(20) and t2.flush(30)
        stored = {str(i) for i in Rollout.objects.filter(node=again).values_list("id", flat=True)}
        assert stored == {g.id for g in groups}
        assert (t2.counts().accepted, t2.counts().pending) == (5, 0)
