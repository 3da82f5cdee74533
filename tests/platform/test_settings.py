import json
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
        assert db["ENGINE"] == "config.pg_backend"
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


def _clean_env(env: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SAPO_") and k != "DATABASE_URL"}
    clean.pop("DJANGO_SETTINGS_MODULE", None)
    clean.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # the browser tests' conftest sets it for this process only
    return {**clean, "PYTHONPATH": os.pathsep.join([str(REPO / "platform"), str(REPO / "node_client")]), **env}


def run_settings(env: dict[str, str], code: str | None = None) -> subprocess.CompletedProcess:
    """Import the settings in a fresh interpreter with exactly these SAPO variables."""
    code = code or "import config.settings as s; print(s.DEBUG, len(s.SECRET_KEY), s.DATABASES['default']['ENGINE'])"
    return subprocess.run([sys.executable, "-c", code], env=_clean_env(env), capture_output=True, text=True, timeout=60)


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=_clean_env(env), capture_output=True, text=True, timeout=300
    )


#: SAPO_ENV=production and only what it requires.
PRODUCTION = {
    "SAPO_ENV": "production",
    "SAPO_SECRET_KEY": "a-production-key-of-fifty-characters-or-more-0123456789",
    "DATABASE_URL": "postgresql://x@127.0.0.1:9/db",  # never connected to by these tests
    "SAPO_ALLOWED_HOSTS": "sapo.example.org",
}

SECURITY = (
    "import json, config.settings as s; print(json.dumps({k: getattr(s, k, None) for k in ("
    "'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', "
    "'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_PROXY_SSL_HEADER', 'CONTENT_SECURITY_POLICY')}))"
)


class TestSettings:
    def test_protocol_limits_and_catalogue_are_read_once_into_settings(self, tmp_path):
        code = "import config.settings as s; print(sorted(s.SAPO_LIMITS.items()), s.SAPO_CATALOGUE)"
        env = {"SAPO_VAR_DIR": str(tmp_path), "SAPO_MAX_SAMPLE_N": "7", "SAPO_SAMPLE_WINDOW_SECONDS": "60"}
        result = run_settings({**env, "SAPO_CATALOGUE": "easy"}, code)
        assert result.stdout.strip() == "[('max_sample_n', 7), ('sample_window_seconds', 60)] easy", result.stderr
        assert run_settings({"SAPO_VAR_DIR": str(tmp_path)}, code).stdout.strip() == "[] sapo"
        assert "not an integer" in run_settings({**env, "SAPO_MAX_SAMPLE_N": "many"}, code).stderr

    def test_audit_rates_per_model_are_read_once_into_settings(self, tmp_path):
        code = "import config.settings as s; print(sorted(s.SAPO_AUDIT_RATES.items()))"
        env = {"SAPO_VAR_DIR": str(tmp_path)}
        rates = " smollm2-135m=0.005, tiny = 0.05 ,,small=0,tiny-mini=1,learn=1e-3"
        result = run_settings({**env, "SAPO_AUDIT_RATES": rates}, code)
        assert result.stdout.strip() == str(
            [("learn", 0.001), ("small", 0.0), ("smollm2-135m", 0.005), ("tiny", 0.05), ("tiny-mini", 1.0)]
        ), result.stderr
        assert run_settings({**env, "SAPO_AUDIT_RATES": ""}, code).stdout.strip() == "[]"
        assert run_settings(env, code).stdout.strip() == "[]"

    @pytest.mark.parametrize(
        ("rates", "said"),
        [
            ("smollm2-135m", "expected model=rate pairs, got 'smollm2-135m'"),
            ("tiny=0.05,smollm2-135m=", "expected model=rate pairs, got 'smollm2-135m='"),
            ("smollm2-135m=rarely", "expected model=rate pairs, got 'smollm2-135m=rarely'"),
            ("smollm2-135m=0.1=0.2", "expected model=rate pairs, got 'smollm2-135m=0.1=0.2'"),
            ("=0.1", "a model name and a rate in [0, 1], got '=0.1'"),
            ("tiny=1.5", "a model name and a rate in [0, 1], got 'tiny=1.5'"),
            ("tiny=-0.01", "a model name and a rate in [0, 1], got 'tiny=-0.01'"),
            ("tiny=nan", "a model name and a rate in [0, 1], got 'tiny=nan'"),
            ("tiny=inf", "a model name and a rate in [0, 1], got 'tiny=inf'"),
            ("tiny=0.1,small=0.2,tiny=0.3", "'tiny' is named twice"),
        ],
    )
    def test_a_bad_audit_rate_is_refused_at_start_up(self, tmp_path, rates, said):
        result = run_settings({"SAPO_VAR_DIR": str(tmp_path), "SAPO_AUDIT_RATES": rates})
        assert result.returncode != 0 and not result.stdout
        assert f"common.env.EnvError: SAPO_AUDIT_RATES: {said}" in result.stderr, result.stderr

    def test_file_emails_go_under_the_var_dir(self, tmp_path):
        code = "import config.settings as s; print(s.EMAIL_FILE_PATH)"
        result = run_settings({"SAPO_VAR_DIR": str(tmp_path)}, code)
        assert result.stdout.strip() == str(tmp_path / "emails"), result.stderr
        chosen = str(tmp_path / "elsewhere")
        assert (
            run_settings({"SAPO_VAR_DIR": str(tmp_path), "SAPO_EMAIL_FILE_PATH": chosen}, code).stdout.strip() == chosen
        )

    def test_limits_come_from_settings_only(self, settings, monkeypatch):
        from pool.limits import Limits, current_limits

        monkeypatch.setenv("SAPO_MAX_SAMPLE_N", "3")  # read once at start-up, not per connection
        settings.SAPO_LIMITS = {"max_frame_bytes": 5000}
        limits = current_limits()
        assert (limits.max_frame_bytes, limits.max_sample_n) == (5000, Limits.max_sample_n)

    def test_production_without_secret_key_fails_at_start_up(self):
        result = run_settings({**PRODUCTION, "SAPO_SECRET_KEY": ""})
        assert result.returncode != 0
        assert "SAPO_SECRET_KEY" in result.stderr

    def test_production_without_database_url_fails_at_start_up(self):
        result = run_settings({**PRODUCTION, "DATABASE_URL": ""})
        assert result.returncode != 0
        assert "DATABASE_URL" in result.stderr

    def test_production_without_allowed_hosts_fails_at_start_up(self):
        result = run_settings({**PRODUCTION, "SAPO_ALLOWED_HOSTS": ""})
        assert result.returncode != 0
        assert "SAPO_ALLOWED_HOSTS" in result.stderr

    def test_production_is_not_debug(self):
        result = run_settings({**PRODUCTION, "SAPO_SECRET_KEY": "k" * 50})
        assert result.stdout.split() == ["False", "50", "config.pg_backend"]

    def test_production_is_https_only_by_default(self):
        result = run_settings(PRODUCTION, SECURITY)
        assert result.returncode == 0, result.stderr
        values = json.loads(result.stdout)
        assert values["SESSION_COOKIE_SECURE"] and values["CSRF_COOKIE_SECURE"] and values["SECURE_SSL_REDIRECT"]
        assert values["SECURE_HSTS_SECONDS"] >= 31_536_000 and values["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
        assert values["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
        assert "script-src 'self'" in values["CONTENT_SECURITY_POLICY"]

    def test_production_without_tls_is_an_explicit_choice(self):
        # docker-compose.yml on one's own machine: plain HTTP on localhost.
        values = json.loads(run_settings({**PRODUCTION, "SAPO_HTTPS": "0"}, SECURITY).stdout)
        assert not (values["SESSION_COOKIE_SECURE"] or values["SECURE_SSL_REDIRECT"] or values["SECURE_HSTS_SECONDS"])
        assert values["SECURE_PROXY_SSL_HEADER"] is None

    def test_check_deploy_is_clean_once_static_files_are_collected(self, tmp_path):
        env = {**PRODUCTION, "SAPO_STATIC_ROOT": str(tmp_path / "static")}
        before = manage(env, "check", "--deploy")
        assert "ops.W001" in before.stderr  # every page would be a 500: said before it happens
        assert "ops.W003" in before.stderr  # /metrics open to anyone
        env["SAPO_METRICS_TOKEN"] = "a-scraper-token"
        collected = manage(env, "collectstatic", "--noinput", "-v0")
        assert collected.returncode == 0, collected.stderr
        # Swagger UI is served by the site itself, not a CDN.
        assert (tmp_path / "static" / "drf_spectacular_sidecar" / "swagger-ui-dist" / "swagger-ui-bundle.js").exists()
        result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
        assert result.returncode == 0, result.stderr
        assert "System check identified no issues" in result.stdout

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

    assert isinstance(asgi.application, asgi.ServerStart) and asgi.application.app is asgi.router
    assert isinstance(asgi.router, ProtocolTypeRouter)
    consumer = asgi.websocket_urlpatterns[0]
    assert str(consumer.pattern) == "ws/node/"
    assert consumer.callback.consumer_class.__name__ == "NodeConsumer"
