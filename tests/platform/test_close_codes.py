"""Close codes the server can actually send. Under daphne, autobahn refuses an application's close
with any code but 1000 and 3000-4999 (it raises, and the node gets daphne's own 1011 with an ERROR
"Exception inside application" in the log): every code the platform closes a node socket with is
sent through daphne's own close here, and a socket whose opening fails on the database is closed with
protocol.CLOSE_TRY_AGAIN in process (tests/platform/test_db_outage.py: over a real server); with Redis
down, a daphne server opens its sockets all the same (socket orders reach them from the database)."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import socket
from pathlib import Path

import pytest
from daphne.ws_protocol import WebSocketProtocol
from node_sockets import close_code, open_socket
from websockets.asyncio.client import connect

from sapo_node import protocol
from sockets import opening

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
CLOSERS = {"close", "_shut", "close_for"}  # how the platform closes a node socket (sockets.consumers, sockets.closes)


def daphne_sends(code: int) -> None:
    """Closes a daphne WebSocket with `code` as daphne does for an application's websocket.close
    (autobahn's checks included); raises what autobahn raises for a code it refuses."""
    ws = WebSocketProtocol()
    ws.state = ws.STATE_CLOSED  # the checks run; no frame is written
    ws.serverClose(code=code)


def test_autobahn_refuses_the_code_the_server_used_to_close_with():
    with pytest.raises(Exception, match="invalid close code 1011"):
        daphne_sends(1011)


@pytest.mark.parametrize("code", protocol.SERVER_CLOSE_CODES)
def test_every_close_code_of_the_protocol_can_be_sent(code):
    daphne_sends(code)


def _close_codes_in_platform() -> list[tuple[str, object]]:
    """(where, the code) of every close call in platform/: an int literal as it is, a name (or
    protocol.<name>) as the protocol constant it must be (any other expression is a variable carrying one of those)."""
    found = []
    for path in PLATFORM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr not in CLOSERS:
                continue
            args = [k.value for k in node.keywords if k.arg == "code"] or node.args[:1]
            while any(isinstance(arg, ast.IfExp) for arg in args):  # `A if ... else B`: both
                args = [
                    part for arg in args for part in ((arg.body, arg.orelse) if isinstance(arg, ast.IfExp) else (arg,))
                ]
            for arg in args:
                where = f"{path.relative_to(PLATFORM)}:{node.lineno}"
                if isinstance(arg, ast.Constant):
                    found.append((where, arg.value))
                elif isinstance(arg, ast.Name) and arg.id.startswith("CLOSE_"):
                    found.append((where, getattr(protocol, arg.id, arg.id)))
                elif isinstance(arg, ast.Attribute) and arg.attr.startswith("CLOSE_"):  # protocol.CLOSE_...
                    found.append((where, getattr(protocol, arg.attr, arg.attr)))
    return found


def test_every_close_in_the_platform_sends_a_code_autobahn_accepts():
    found = _close_codes_in_platform()
    assert len(found) >= 4  # the scan does see the consumer's closes
    for where, code in found:
        assert isinstance(code, int), f"{where}: {code} is not a protocol close code"
        daphne_sends(code)  # raises for 1011 and the like


@pytest.fixture
def opening_fails(monkeypatch):
    """Opening a node socket fails as it does with the database down."""
    import django.db

    async def down(self, **kwargs):
        raise django.db.OperationalError('connection failed: connection to server at "127.0.0.1" refused')

    monkeypatch.setattr(opening.SessionOpens, "open", down)


@pytest.mark.django_db(transaction=True)
async def test_a_socket_whose_opening_fails_on_the_database_is_told_to_try_again(node_token, opening_fails, caplog):
    with caplog.at_level(logging.WARNING):
        socket_ = await open_socket(node_token)
        assert await close_code(socket_) == protocol.CLOSE_TRY_AGAIN
    assert [r.levelname for r in caplog.records if r.name == "common.outage"] == ["WARNING"]
    assert "Traceback" not in caplog.text  # one line for an incident, not a bug's trace


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


@pytest.mark.django_db(transaction=True)
def test_over_daphne_with_redis_down_every_socket_opens_and_the_log_has_one_line(asgi_server, node_token, tmp_path):
    """The channel layer's Redis is down (nothing listens on its port) from the server's start: the
    process cannot join the closes group, and needs not (sockets.closes reads the socket orders from the
    database), so every socket is welcomed, and the server logs one warning for the outage, no ERROR."""
    dead_redis = {
        "default": {
            "BACKEND": "common.channel_layers.BoundedRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{_dead_port()}/0"}], "prefix": "sapotest-dead"},
        }
    }
    log_path = tmp_path / "server.log"

    async def answers(url: str) -> list[str]:
        seen = []
        for _ in range(3):
            async with connect(url, additional_headers={"Authorization": f"Bearer {node_token}"}) as ws:
                await ws.send(json.dumps({"type": "hello", "v": 1}))
                seen.append(json.loads(await asyncio.wait_for(ws.recv(), 10))["type"])
        return seen

    with asgi_server(settings={"CHANNEL_LAYERS": dead_redis}, log_path=log_path) as server:
        assert asyncio.run(answers(server.ws_url + "/ws/node/")) == [protocol.WELCOME] * 3
    log = log_path.read_text()
    assert " ERROR " not in log and "Exception inside application" not in log, log[-3000:]
    assert log.count("Redis is unavailable") == 1, log[-3000:]  # one line for the outage, not one per socket


@pytest.mark.django_db(transaction=True)
async def test_the_servers_own_failures_never_close_a_socket_with_4429(node_token, monkeypatch, caplog):
    """More frames than max_consecutive_errors fail on the database (as they do while it is down): each
    is answered internal_error with its ref, none counts against the node, and the log has one line for
    the outage and one for its end."""
    import django.db

    from sockets import consumers

    def down(**kwargs):
        raise django.db.OperationalError('connection failed: connection to server at "127.0.0.1" refused')

    socket_ = await open_socket(node_token, hello=True)
    monkeypatch.setattr(consumers, "rollout_sample", down)
    with caplog.at_level(logging.WARNING):
        for i in range(25):
            await socket_.send_json_to({"type": "sample", "v": 1, "ref": f"r{i}", "n": 2})
            reply = await socket_.receive_json_from(timeout=10)
            assert reply["code"] == protocol.INTERNAL_ERROR and reply["ref"] == f"r{i}", reply
        monkeypatch.undo()
        await socket_.send_json_to({"type": "sample", "v": 1, "ref": "back", "n": 2})
        assert (await socket_.receive_json_from(timeout=10))["type"] == "samples"
    await socket_.disconnect()
    assert [r.getMessage()[:26] for r in caplog.records if r.name == "common.outage"] == [
        "The database is unavailabl",
        "The database answers again",
    ]  # one line when it starts, one when it ends
    assert "Traceback" not in caplog.text
