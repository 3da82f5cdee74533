"""A TCP proxy on loopback that the test controls: it forwards bytes both ways between a node and
the live server, and cuts every current connection on command or when a chunk matches a trigger.

    proxy = CutProxy(server_port).start()
    transport = WebSocketTransport(proxy.ws_url + "/ws/node/", ...)
    proxy.cut_when("down", lambda conn, chunk: b'"for":"share"' in chunk, hold=True)  # drop the first ack
    ...
    proxy.release()   # let connections through again
    proxy.pace("down", 100_000)  # about 100 kB/s server -> node

"up" is node -> server (masked WebSocket frames: only sizes mean something), "down" is
server -> node (unmasked and uncompressed with daphne, so JSON text can be matched). The proxy runs
an asyncio loop on its own thread; every public method is safe to call from the test's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class Connection:
    number: int
    up_bytes: int = 0
    down_bytes: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


#: (connection, chunk) -> how many bytes of the chunk still pass before the cut, or None: no cut.
Trigger = Callable[[Connection, bytes], "int | None"]


class CutProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0  # accepted and forwarded
        self.refused = 0  # closed at once while held
        self.cuts = 0
        self.history: list[Connection] = []  # every forwarded connection, in order
        self._open: dict[int, Connection] = {}
        self._held = False
        self._trigger: tuple[str, Trigger, bool] | None = None
        self._pace: dict[str, float] = {}  # direction -> bytes per second
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="cut-proxy", daemon=True)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ the test's side
    def start(self) -> CutProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shut() -> None:
            assert self._server is not None
            self._server.close()
            self._sever()

        if self._thread.is_alive():
            self._call(shut())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def sever(self, *, hold: bool = False) -> None:
        """Cut every current connection now; with hold=True refuse new ones until release()."""

        async def cut() -> None:
            self._held = self._held or hold
            self._sever()

        self._call(cut())

    def hold(self) -> None:
        self._held = True

    def release(self) -> None:
        self._held = False

    def pace(self, direction: str, bytes_per_second: float | None) -> None:
        """Forward `direction` at about this rate (None: as fast as it comes), e.g. to stop a download
        halfway."""
        if bytes_per_second is None:
            self._pace.pop(direction, None)
        else:
            self._pace[direction] = bytes_per_second

    def cut_when(self, direction: str, trigger: Trigger, *, hold: bool = False) -> None:
        """Arm a one-shot cut: the first chunk going `direction` ("up" or "down") for which
        `trigger(connection, chunk)` returns n passes its first n bytes, then every connection is cut."""
        assert direction in ("up", "down")
        self._trigger = (direction, trigger, hold)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ------------------------------------------------------------------ the proxy's loop
    def _sever(self) -> None:
        for conn in list(self._open.values()):
            for writer in conn.writers:
                writer.transport.abort()
        self._open.clear()

    async def _accept(self, node_reader: asyncio.StreamReader, node_writer: asyncio.StreamWriter) -> None:
        if self._held:
            self.refused += 1
            node_writer.transport.abort()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            node_writer.transport.abort()
            return
        self.connections += 1
        conn = Connection(self.connections, writers=[node_writer, server_writer])
        self.history.append(conn)
        self._open[conn.number] = conn
        await asyncio.gather(
            self._pump(conn, "up", node_reader, server_writer),
            self._pump(conn, "down", server_reader, node_writer),
        )
        self._open.pop(conn.number, None)

    async def _pump(
        self, conn: Connection, direction: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while chunk := await reader.read(CHUNK):
                if rate := self._pace.get(direction):
                    await asyncio.sleep(len(chunk) / rate)
                keep = self._check(conn, direction, chunk)
                if keep is not None:
                    if keep > 0:  # the head of the chunk still goes through: the cut lands mid-frame
                        writer.write(chunk[:keep])
                        await writer.drain()
                        await asyncio.sleep(0.05)
                    self.cuts += 1
                    self._sever()
                    return
                writer.write(chunk)
                await writer.drain()
                if direction == "up":
                    conn.up_bytes += len(chunk)
                else:
                    conn.down_bytes += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: close both after what was written (a half-open pair would hang on).
            for w in conn.writers:
                with contextlib.suppress(Exception):
                    w.close()

    def _check(self, conn: Connection, direction: str, chunk: bytes) -> int | None:
        if self._trigger is None or self._trigger[0] != direction:
            return None
        _, trigger, hold = self._trigger
        keep = trigger(conn, chunk)
        if keep is None:
            return None
        self._trigger = None
        self._held = self._held or hold
        return max(0, min(int(keep), len(chunk)))
