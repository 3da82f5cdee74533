"""sockets.opening: sockets opening together share one database call, and each gets its own answer."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from django.utils import timezone
from factories import make_node_with_token, make_user

from accounts.models import User
from common.errors import ApplicationError
from sockets import opening

pytestmark = pytest.mark.django_db(transaction=True)


def banned_node_with_token():
    node, token = make_node_with_token()
    User.objects.filter(id=node.owner_id).update(banned_at=timezone.now())
    return node, token


def nodes_with_tokens(count: int) -> list:
    out = []
    for start in range(0, count, 10):  # an account holds at most SAPO_NODES_PER_ACCOUNT nodes
        owner = make_user()
        out += [make_node_with_token(owner=owner, name=f"n{i}") for i in range(start, min(count, start + 10))]
    return out


async def opened(tokens: list[str | None], base_quota: int = 60) -> tuple[list, list[int]]:
    opens = opening.session_opens()

    async def one(token):
        try:
            return await opens.open(token=token, connection_id=uuid.uuid4(), base_quota=base_quota)
        except (ApplicationError, psycopg.Error) as exc:
            return exc

    return await asyncio.gather(*(one(t) for t in tokens)), opens.batches


def test_sockets_opening_at_once_share_a_statement_and_each_get_their_own_answer(statements):
    nodes = nodes_with_tokens(40)
    _, banned_token = banned_node_with_token()
    tokens = [t for _, t in nodes[:20]] + [banned_token, "garbage"] + [t for _, t in nodes[20:]]

    answers, batches = asyncio.run(opened(tokens))

    expected = [n.id for n, _ in nodes[:20]] + ["banned", "unauthenticated"] + [n.id for n, _ in nodes[20:]]
    assert [a.code if isinstance(a, ApplicationError) else a[0].id for a in answers] == expected
    assert {a[1] for a in answers if not isinstance(a, ApplicationError)} <= set(range(1, 61))  # a quota each
    session_statements = [s for s in statements if "nodes_nodeconnection" in s and "token_hash" in s]
    assert sum(batches) == len(tokens) and len(session_statements) == len(batches) < 5


def test_one_socket_alone_opens_at_once(statements):
    (node, token), *_ = nodes_with_tokens(1)

    async def alone():
        answer, batches = await opened([token])
        return answer, batches, await opened([token])

    (answer,), first, (again, second) = asyncio.run(alone())
    assert answer[0].id == node.id and again[0][0].id == node.id and second == [1, 1]


def test_a_failing_call_fails_every_socket_it_carried_and_the_next_call_works(monkeypatch):
    nodes = nodes_with_tokens(5)

    def down(**kwargs):
        raise psycopg.OperationalError("the database went away")

    monkeypatch.setattr(opening, "nodes_sessions_open", down)
    failed, _ = asyncio.run(opened([t for _, t in nodes]))
    assert all(isinstance(a, psycopg.OperationalError) for a in failed)
    monkeypatch.undo()
    answers, _ = asyncio.run(opened([t for _, t in nodes]))
    assert [a[0].id for a in answers] == [n.id for n, _ in nodes]


def test_a_socket_that_goes_away_while_waiting_leaves_the_others_their_answers():
    nodes = nodes_with_tokens(6)

    async def crowd():
        opens = opening.session_opens()
        tasks = [asyncio.create_task(opens.open(token=t, connection_id=uuid.uuid4(), base_quota=60)) for _, t in nodes]
        await asyncio.sleep(0)  # all six waiting for the call
        tasks[2].cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    answers = asyncio.run(crowd())
    assert isinstance(answers[2], asyncio.CancelledError)
    assert [a[0].id for i, a in enumerate(answers) if i != 2] == [n.id for i, (n, _) in enumerate(nodes) if i != 2]
