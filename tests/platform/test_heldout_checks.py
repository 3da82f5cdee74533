"""Held-out checks (sockets.heldout, docs/protocol.md, "heldout_check"): over a real daphne socket, a node
whose hello says `heldout` is asked a check after its reports, its answers are scored and stored; a late
answer, an answer to a check or question not asked and a second answer are refused with their codes and
store nothing; a node whose hello does not say `heldout` (an older client) is never asked. Scoring itself,
in process, with the verifiers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import factories
import pytest
from django.utils import timezone
from support.live_nodes import HELLO, TIMEOUT
from support.pool import make_group, to_rollout_in
from websockets.sync.client import ClientConnection, connect

from pool.models import HeldoutScore
from pool.verification import HELDOUT_SEED, verify_rollout
from sapo_node import protocol
from sapo_node.tasks import EASY_CATALOGUE, SAPO_CATALOGUE, build_first
from sockets.heldout import AskedCheck, heldout_score_record
from swarms.services import swarm_default_ensure

#: The server's settings: a check after every second round reported, three questions, no pause between.
CHECKS = {
    "SAPO_HELDOUT_EVERY_ROUNDS": 2,
    "SAPO_HELDOUT_MIN_SECONDS": 0.0,
    "SAPO_HELDOUT_QUESTIONS": 3,
}


@contextmanager
def _node_socket(server, token: str, *, heldout: bool) -> Iterator[ClientConnection]:
    with connect(
        f"{server.ws_url}/ws/node/", additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=TIMEOUT
    ) as ws:
        ws.send(json.dumps({**HELLO, **({"heldout": True} if heldout else {})}))
        welcome = json.loads(ws.recv(timeout=TIMEOUT))
        assert welcome["type"] == "welcome"
        ws.datasets = {task["dataset"] for task in welcome["catalogue"]["tasks"]}
        yield ws


def _frames_after(ws, frame: dict, *, until: str, seconds: float = TIMEOUT) -> list[dict]:
    """Send `frame`, then the frames received until one of type `until` (or `seconds` pass)."""
    ws.send(json.dumps(frame))
    got: list[dict] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            got.append(json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic()))))
        except TimeoutError:
            break
        if got[-1]["type"] == until:
            break
    return got


def _report(round_: int) -> dict:
    return {"type": protocol.REPORT, "v": 1, "round": round_, "external": 2, "ref": f"r{round_}"}


def _answers(check: dict, *, round_: int, text: str = "<answer>0</answer>", ref: str = "a") -> dict:
    answers = [{"id": q["id"], "text": text} for q in check["questions"]]
    return {
        "type": protocol.HELDOUT_ANSWERS,
        "v": 1,
        "check": check["check"],
        "round": round_,
        "answers": answers,
        "ref": ref,
    }


@pytest.fixture
def tokens(db):
    user = factories.make_user(username="carol", display_name="Carol")
    new = factories.make_node(owner=user, name="new-client")
    old = factories.make_node(owner=user, name="old-client")
    return (new, factories.make_node_token(node=new)[1]), (old, factories.make_node_token(node=old)[1])


@pytest.mark.django_db(transaction=True)
def test_a_node_is_asked_its_answers_are_scored_and_refusals_store_nothing(asgi_server, tokens):
    (new, new_token), (old, old_token) = tokens
    with asgi_server(settings=CHECKS) as server:
        with (
            _node_socket(server, new_token, heldout=True) as ws,
            _node_socket(server, old_token, heldout=False) as old_ws,
        ):
            got = _frames_after(ws, _report(1), until=protocol.HELDOUT_CHECK)
            assert [f["type"] for f in got] == [protocol.ACK, protocol.HELDOUT_CHECK], got
            check = got[-1]
            assert len(check["questions"]) == 3 and [q["id"] for q in check["questions"]] == [0, 1, 2]
            assert {q["dataset"] for q in check["questions"]} <= ws.datasets  # the swarm's catalogue's
            assert 0 < check["max_new_tokens"] <= protocol.HELDOUT_MAX_NEW_TOKENS and check["deadline"] > time.time()

            # One round later: not due yet (every second round), and one check is open anyway.
            assert [f["type"] for f in _frames_after(ws, _report(2), until=protocol.HELDOUT_CHECK, seconds=2)] == [
                protocol.ACK
            ]

            # Not asked: another check id, a question the check does not have. Nothing stored.
            unasked = _frames_after(ws, {**_answers(check, round_=2), "check": str(uuid.uuid4())}, until=protocol.ERROR)
            assert unasked[-1]["code"] == protocol.HELDOUT_UNASKED and unasked[-1]["ref"] == "a"
            extra = _answers(check, round_=2)
            extra["answers"].append({"id": 7, "text": "x"})
            assert _frames_after(ws, extra, until=protocol.ERROR)[-1]["code"] == protocol.HELDOUT_UNASKED
            twice = _answers(check, round_=2)
            twice["answers"][1]["id"] = 0
            assert _frames_after(ws, twice, until=protocol.ERROR)[-1]["code"] == protocol.HELDOUT_DUPLICATE
            assert not HeldoutScore.objects.exists()

            ack = _frames_after(ws, _answers(check, round_=2), until=protocol.ACK)[-1]
            assert ack["for"] == protocol.HELDOUT_ANSWERS and ack["questions"] == 3 and ack["check"] == check["check"]
            (row,) = HeldoutScore.objects.all()
            assert (row.node_id, row.round, row.questions, row.score) == (new.id, 2, 3, ack["score"])
            assert row.swarm_id == swarm_default_ensure().id and row.asked_at <= row.answered_at

            again = _frames_after(ws, _answers(check, round_=2), until=protocol.ERROR)
            assert again[-1]["code"] == protocol.HELDOUT_DUPLICATE
            assert HeldoutScore.objects.count() == 1

            # Two rounds after the last check: the next one.
            assert _frames_after(ws, _report(3), until=protocol.HELDOUT_CHECK)[-1]["type"] == protocol.HELDOUT_CHECK

            # A client that did not say `heldout` in its hello is never asked, whatever it reports.
            for round_ in range(1, 6):
                assert [f["type"] for f in _frames_after(old_ws, _report(round_), until="", seconds=1.5)] == [
                    protocol.ACK
                ]


@pytest.mark.django_db(transaction=True)
def test_an_answer_after_the_deadline_is_refused_and_stores_nothing(asgi_server, tokens):
    (_, token), _ = tokens
    with asgi_server(settings={**CHECKS, "SAPO_HELDOUT_DEADLINE_SECONDS": 1.0}) as server:
        with _node_socket(server, token, heldout=True) as ws:
            check = _frames_after(ws, _report(1), until=protocol.HELDOUT_CHECK)[-1]
            assert check["type"] == protocol.HELDOUT_CHECK
            time.sleep(max(0.0, check["deadline"] - time.time()) + 0.2)
            late = _frames_after(ws, _answers(check, round_=1), until=protocol.ERROR)
            assert late[-1]["code"] == protocol.HELDOUT_LATE
            assert not HeldoutScore.objects.exists()


@pytest.mark.django_db
def test_the_answers_are_scored_by_the_verifiers(node):
    spec = EASY_CATALOGUE.get("basic_arithmetic")
    entries = [build_first(spec, protocol.HELDOUT_SEED, iter([i, i + 100]))[1] for i in (1, 2, 3, 4)]
    check = AskedCheck(
        id=uuid.uuid4(),
        questions=[(spec, e) for e in entries],
        asked_at=timezone.now(),
        deadline=time.time() + 60,
    )
    right = [f" <answer>{e['answer']}</answer>" for e in entries]
    texts = right[:3] + [f"<answer>{int(entries[3]['answer']) + 1}</answer>"]
    row = heldout_score_record(node_id=node.id, swarm_id=swarm_default_ensure().id, check=check, texts=texts, round_=9)
    assert (row.questions, row.score, row.round) == (4, 3.0, 9)


def test_the_pool_refuses_a_group_of_the_held_out_stream():
    """Shared, a group of the held-out seed would be trained on by other nodes: refused, unbuilt."""
    honest = make_group(seed=protocol.HELDOUT_SEED + 1)
    assert verify_rollout(to_rollout_in(honest), SAPO_CATALOGUE).accepted
    held_out = make_group(seed=protocol.HELDOUT_SEED)
    verdict = verify_rollout(to_rollout_in(held_out), SAPO_CATALOGUE)
    assert (verdict.accepted, verdict.reason, verdict.verified_rewards) == (False, HELDOUT_SEED, None)
