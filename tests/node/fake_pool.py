"""A stand-in for the platform's /ws/node/ endpoint, enough of docs/protocol.md to drive the node's
WebSocket transport: hello -> welcome, share -> ack (idempotent ids, chosen rejections), sample ->
samples, report -> ack, close 4401 on a bad token. Runs its own asyncio loop in a thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from sapo_node.tasks import EASY_CATALOGUE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakePool:
    def __init__(self, port: int | None = None, token: str = "good-token", close_code: int | None = None) -> None:
        self.port = port or free_port()
        self.token = token
        self.close_code = close_code  # close every connection with this code right after accepting
        self.closed_at: list[float] = []  # when each connection was closed with close_code (monotonic)
        self.busy_upgrades = 0  # answer this many upgrades HTTP 403, as daphne does when it is too busy
        self.groups: dict[str, dict[str, Any]] = {}  # id -> rollout, as the pool stores them
        self.share_frames: list[list[str]] = []  # ids of every share frame received, in order
        self.reject: dict[str, str] = {}  # id -> reason
        self.drop_next_ack = False  # store the next share, then cut the connection without acking
        self.sampleable: list[dict[str, Any]] = []
        self.reports: list[dict[str, Any]] = []
        self.sample_requests = 0
        self.sample_sizes: list[int] = []  # n of each sample request, in order
        self.serve_once = False  # True: each sampleable group is served once (a pool with fresh groups)
        self.serve_step: int | None = None  # each reply starts this many groups after the last one's start
        self._served_from = 0
        self.connections = 0
        self.limits: dict[str, int] = {"max_groups_per_message": 2}  # welcome.limits
        self.challenges: list[str] = []  # welcome.challenge, then one per share's ack, while any is left
        self.audits: list[dict[str, Any]] = []  # welcome.audits and every share's ack.audits
        self._open: set[ServerConnection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/node/"

    def start(self) -> FakePool:
        ready = threading.Event()

        async def main() -> None:
            self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
            async with serve(self._handler, "127.0.0.1", self.port, process_request=self._busy):
                ready.set()
                await self._stopped.wait()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        assert ready.wait(5)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(5)

    def kick(self) -> None:
        """Cut every open connection (as a restarting server would)."""

        async def close_all() -> None:
            for ws in list(self._open):
                await ws.close(1012, "restart")

        asyncio.run_coroutine_threadsafe(close_all(), self._loop).result(5)

    def _busy(self, connection: ServerConnection, request):
        if self.busy_upgrades > 0:
            self.busy_upgrades -= 1
            return connection.respond(HTTPStatus.FORBIDDEN, "Access denied\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        if ws.request.headers.get("Authorization") != f"Bearer {self.token}":
            await ws.close(4401, "bad token")
            return
        if self.close_code is not None:
            self.closed_at.append(time.monotonic())
            await ws.close(self.close_code, "closed")
            return
        self.connections += 1
        self._open.add(ws)
        try:
            async for raw in ws:
                frame = json.loads(raw)
                reply = self._reply(frame)
                if reply == "cut":
                    await ws.close(1011, "lost")
                    return
                if reply is not None:
                    if "ref" in frame:
                        reply["ref"] = frame["ref"]
                    await ws.send(json.dumps(reply))
        finally:
            self._open.discard(ws)

    def _proof_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"challenge": self.challenges.pop(0)} if self.challenges else {}
        return fields | ({"audits": list(self.audits)} if self.audits else {})

    def _reply(self, frame: dict[str, Any]) -> dict[str, Any] | str | None:
        kind = frame["type"]
        if kind == "hello":
            return {
                "type": "welcome",
                "v": 1,
                "node_id": 1,
                "node_name": "laptop",
                "catalogue": EASY_CATALOGUE.to_json(),
                "limits": dict(self.limits),
                **self._proof_fields(),
            }
        if kind == "share":
            ids = [r["id"] for r in frame["rollouts"]]
            self.share_frames.append(ids)
            accepted, rejected = [], []
            for rollout in frame["rollouts"]:
                if rollout["id"] in self.reject:
                    rejected.append({"id": rollout["id"], "reason": self.reject[rollout["id"]]})
                else:
                    self.groups.setdefault(rollout["id"], rollout)
                    accepted.append(rollout["id"])
            if self.drop_next_ack:
                self.drop_next_ack = False
                return "cut"
            ack = {"type": "ack", "v": 1, "for": "share", "accepted": accepted, "rejected": rejected}
            return ack | self._proof_fields()
        if kind == "sample":
            self.sample_requests += 1
            self.sample_sizes.append(frame["n"])
            served = self.sampleable[self._served_from : self._served_from + frame["n"]]
            if self.serve_step is not None:  # the next reply repeats some of these (uniform draws do)
                self._served_from += self.serve_step
            if self.serve_once:
                self.sampleable = self.sampleable[len(served) :]
            return {"type": "samples", "v": 1, "rollouts": served}
        if kind == "report":
            self.reports.append(frame)
            return {"type": "ack", "v": 1, "for": "report", "round": frame["round"]}
        return {"type": "error", "v": 1, "code": "unknown_type", "detail": kind}
