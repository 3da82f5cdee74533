"""common.embedded_db: the embedded PostgreSQL of a checkout when another program (another
checkout's embedded server, most likely) holds the default port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from common import embedded_db

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def taken_port():
    """A port some other program listens on."""
    with socket.socket() as holder:
        holder.bind((embedded_db.HOST, 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A fresh checkout's var/ (no server yet); its server is stopped afterwards."""
    monkeypatch.setenv("SAPO_VAR_DIR", str(tmp_path / "var"))
    monkeypatch.delenv("SAPO_EMBEDDED_PG_PORT", raising=False)
    tmp_path.chmod(0o755)  # the server runs as its own user when the tests run as root
    yield tmp_path
    embedded_db.stop()


def test_a_checkout_whose_default_port_is_taken_starts_on_the_next_free_one(checkout, taken_port, monkeypatch):
    monkeypatch.setattr(embedded_db, "DEFAULT_PORT", taken_port)

    url = embedded_db.ensure_running()

    port = embedded_db.status().port
    assert port != taken_port and url == embedded_db.database_url(port)
    with psycopg.connect(url) as connection:  # this checkout's own server, found again by its pid file
        assert connection.execute("SELECT current_setting('port')::int").fetchone()[0] == port
    assert embedded_db.embedded_database_url() == url and embedded_db.ensure_running() == url


def test_a_port_set_explicitly_and_taken_is_named_in_the_error(checkout, taken_port, monkeypatch):
    monkeypatch.setenv("SAPO_EMBEDDED_PG_PORT", str(taken_port))
    with pytest.raises(RuntimeError, match=f"{taken_port}.*another program holds that port"):
        embedded_db.ensure_running()
    assert not embedded_db.status().running


def test_django_in_a_second_checkout_connects_to_its_own_server(checkout, monkeypatch):
    """The settings read the port before the server starts; the backend follows where it listens."""
    with socket.socket() as holder:
        try:  # the default port held: by this, or by this test run's own embedded server already
            holder.bind((embedded_db.HOST, embedded_db.DEFAULT_PORT))
            holder.listen()
        except OSError:
            pass
        code = (
            "import django; django.setup()\n"
            "from django.db import connection\n"
            "with connection.cursor() as c:\n"
            "    c.execute(\"SELECT current_setting('port'), current_setting('data_directory')\")\n"
            "    print(*c.fetchone())\n"
        )
        env = {**os.environ, "SAPO_VAR_DIR": str(checkout / "var"), "DJANGO_SETTINGS_MODULE": "config.settings"}
        env.pop("DATABASE_URL", None)
        env.pop("SAPO_EMBEDDED_PG_PORT", None)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "platform"), str(REPO / "node_client")])
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    port, data_directory = result.stdout.split()
    assert int(port) != embedded_db.DEFAULT_PORT and int(port) == embedded_db.status().port
    assert Path(data_directory) == checkout / "var" / "postgres"
