import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from common.env import EnvError, env_bool, env_int, env_list, parse_database_url
from common.errors import ApplicationError, drf_exception_handler

REPO = Path(__file__).resolve().parents[2]


class TestEnv:
    def test_helpers(self, monkeypatch):
        monkeypatch.setenv("X_BOOL", "yes")
        monkeypatch.setenv("X_INT", "12")
        monkeypatch.setenv("X_LIST", "a, b,,c ")
        assert env_bool("X_BOOL") is True
        assert env_bool("X_MISSING", default=True) is True
        assert env_int("X_INT", 3) == 12
        assert env_list("X_LIST") == ["a", "b", "c"]
        monkeypatch.setenv("X_INT", "twelve")
        with pytest.raises(EnvError):
            env_int("X_INT", 3)

    def test_parse_database_url(self):
        db = parse_database_url("postgresql://u:p%40ss@db.example:5433/sapo?sslmode=require")
        assert db["ENGINE"] == "django.db.backends.postgresql"
        assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
            "u",
            "p@ss",
            "db.example",
            "5433",
            "sapo",
        )
        assert db["OPTIONS"] == {"sslmode": "require"}
        assert parse_database_url("postgresql://postgres@/x?host=/run/pg")["HOST"] == "/run/pg"

    @pytest.mark.parametrize("url", ["sqlite:///db.sqlite3", "mysql://u@h/db"])
    def test_only_postgresql(self, url):
        with pytest.raises(EnvError):
            parse_database_url(url)


def run_settings(env: dict[str, str]) -> subprocess.CompletedProcess:
    """Import the settings in a fresh interpreter with exactly these SAPO variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAPO_") and k != "DATABASE_URL"}
    code = "import config.settings as s; print(s.DEBUG, len(s.SECRET_KEY), s.DATABASES['default']['ENGINE'])"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**clean, "PYTHONPATH": str(REPO / "platform"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


class TestSettings:
    def test_production_without_secret_key_fails_at_start_up(self):
        result = run_settings({"SAPO_ENV": "production", "DATABASE_URL": "postgresql://x@h/db"})
        assert result.returncode != 0
        assert "SAPO_SECRET_KEY" in result.stderr

    def test_production_without_database_url_fails_at_start_up(self):
        result = run_settings({"SAPO_ENV": "production", "SAPO_SECRET_KEY": "k" * 50})
        assert result.returncode != 0
        assert "DATABASE_URL" in result.stderr

    def test_production_is_not_debug(self):
        result = run_settings(
            {"SAPO_ENV": "production", "SAPO_SECRET_KEY": "k" * 50, "DATABASE_URL": "postgresql://x@h/db"}
        )
        assert result.stdout.split() == ["False", "50", "django.db.backends.postgresql"]

    def test_development_generates_a_key_and_uses_the_embedded_server(self, tmp_path):
        result = run_settings({"SAPO_VAR_DIR": str(tmp_path)})
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [
            "True",
            str(len((tmp_path / "secret_key").read_text())),
            "config.embedded_backend",
        ]
        # Importing settings starts nothing: the server starts on first connection.
        assert not (tmp_path / "postgres").exists()

    def test_no_sqlite_anywhere(self, settings):
        assert all("sqlite" not in db["ENGINE"] for db in settings.DATABASES.values())
        assert settings.AUTH_USER_MODEL == "accounts.User"
        assert settings.INSTALLED_APPS[0] == "daphne"


class TestExceptionHandler:
    def render(self, exc: Exception):
        request = APIRequestFactory().get("/")
        return drf_exception_handler(exc, {"view": APIView(), "request": request})

    def test_application_error(self):
        response = self.render(ApplicationError("name_taken", "Taken.", status=409, extra={"field": "name"}))
        assert response.status_code == 409
        assert response.data == {"code": "name_taken", "detail": "Taken.", "field": "name"}

    def test_django_404(self):
        from django.http import Http404

        response = self.render(Http404())
        assert response.status_code == 404
        assert response.data["code"] == "not_found"


def test_asgi_routes_node_socket_to_the_pool_consumer():
    from channels.routing import ProtocolTypeRouter

    from config import asgi

    assert isinstance(asgi.application, ProtocolTypeRouter)
    consumer = asgi.websocket_urlpatterns[0]
    assert str(consumer.pattern) == "ws/node/"
    assert consumer.callback.consumer_class.__name__ == "NodeConsumer"
