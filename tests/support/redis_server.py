"""A redis-server of a test's own (a free port, its own directory, no persistence), for tests that
stop, restart or flush Redis: never the shared one the other tests use. `.ci/run` runs as a user that
can start it the same way (redis-server is on the PATH of the CI image, as on a developer machine)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process on a fixed port: `stop()` kills it, `start()` starts an empty one on the
    same port (a restart without persistence), `flush()` forgets everything (FLUSHALL), `pause()` hangs
    it (SIGSTOP: the kernel still accepts connections, nothing answers) until `resume()` (SIGCONT)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
            + ["--save", "", "--appendonly", "no", "--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Down and up again, empty."""
        self.stop()
        self.start()

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=1).ping())
        except redis.exceptions.ConnectionError:
            return False

    def flush(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushall()

    def server_settings(self, prefix: str) -> dict:
        """The settings a site process on this Redis has (config/settings.py's, with this URL)."""
        return {
            "REDIS_URL": self.url,
            "SAPO_REDIS_PREFIX": prefix,
            "CHANNEL_LAYERS": {
                "default": {
                    "BACKEND": "common.channel_layers.BoundedRedisChannelLayer",
                    "CONFIG": {"hosts": [{"address": self.url}], "prefix": f"{prefix}:asgi"},
                }
            },
        }


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    directory = Path(tempfile.mkdtemp(prefix="sapo-redis-"))
    server = RedisServer(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)
