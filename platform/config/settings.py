"""Django settings for the SAPO Swarm platform. Every value that varies by deployment comes from the
environment, read here and nowhere else (helpers in common/env.py).

Environment:
  SAPO_ENV              "development" (default) or "production". Production requires
                        SAPO_SECRET_KEY and DATABASE_URL and turns DEBUG off.
  SAPO_DEBUG            1/0; defaults to on in development, off in production.
  SAPO_SECRET_KEY       required in production; in development a key is generated once into
                        var/secret_key.
  SAPO_ALLOWED_HOSTS    comma-separated; development defaults to localhost names.
  SAPO_CSRF_TRUSTED_ORIGINS  comma-separated origins (https://sapo.example).
  SAPO_HTTPS            1 when served over HTTPS: secure cookies, HSTS, proxy SSL header.
  DATABASE_URL          postgresql://...; unset (development only): the embedded PostgreSQL in
                        var/postgres on 127.0.0.1:SAPO_EMBEDDED_PG_PORT (54329), see config/embedded_db.py.
  SAPO_CONN_MAX_AGE     seconds a DB connection is kept (default 0, see DATABASES below).
  REDIS_URL             redis://...; unset: an in-memory channel layer (one process only).
  SAPO_LOG_LEVEL        default INFO.
  Protocol limits (SAPO_MAX_*) are read by the pool app, see docs/protocol.md.
"""

from __future__ import annotations

import secrets
import warnings
from pathlib import Path

from common.env import EnvError, env_bool, env_int, env_list, env_str, parse_database_url

BASE_DIR = Path(__file__).resolve().parents[2]  # the repository root
PLATFORM_DIR = BASE_DIR / "platform"
FRONTEND_DIR = BASE_DIR / "frontend"
VAR_DIR = Path(env_str("SAPO_VAR_DIR") or BASE_DIR / "var")

SAPO_ENV = env_str("SAPO_ENV", "development")
if SAPO_ENV not in {"development", "production"}:
    raise EnvError(f"SAPO_ENV must be 'development' or 'production', got {SAPO_ENV!r}")
PRODUCTION = SAPO_ENV == "production"

DEBUG = env_bool("SAPO_DEBUG", default=not PRODUCTION)


def _secret_key() -> str:
    key = env_str("SAPO_SECRET_KEY", "")
    if key:
        return key
    if PRODUCTION:
        raise EnvError("SAPO_SECRET_KEY must be set when SAPO_ENV=production")
    # Development: one random key per checkout, kept outside the repository's tracked files.
    path = VAR_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    path.write_text(key)
    path.chmod(0o600)
    return key


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list(
    "SAPO_ALLOWED_HOSTS", [] if PRODUCTION else ["localhost", "127.0.0.1", "[::1]", "0.0.0.0", "testserver"]
)
CSRF_TRUSTED_ORIGINS = env_list("SAPO_CSRF_TRUSTED_ORIGINS", [])

HTTPS = env_bool("SAPO_HTTPS", default=False)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("SAPO_HSTS_SECONDS", 3600)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "daphne",  # first: `manage.py runserver` then serves HTTP and WebSockets (ASGI_APPLICATION)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "channels",
    # Project apps (platform/<name>).
    "common",
    "accounts",
    "nodes",
    "pool",
    "localswarm",  # `manage.py sapo_local`, what `make run` starts
    # --- Added by other helpers: moderation, web. Keep the project apps above in this order. ---
    "moderation",
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [FRONTEND_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database: PostgreSQL only (psycopg 3) ---------------------------------------------------
_database_url = env_str("DATABASE_URL", "")
if _database_url:
    _default_db = parse_database_url(_database_url)
elif PRODUCTION:
    raise EnvError("DATABASE_URL must be set when SAPO_ENV=production")
else:
    from config.embedded_db import embedded_database_url

    _default_db = parse_database_url(embedded_database_url())
    # Same PostgreSQL backend, but it starts the embedded server before the first connection.
    _default_db["ENGINE"] = "config.embedded_backend"

# Under ASGI every sync_to_async call may run on another thread, and Channels' database_sync_to_async
# closes obsolete connections around each call; Django advises against persistent connections in
# async deployments, hence 0 (one connection per request/consumer call). Health checks make a
# raised value safe behind a pooler.
_default_db["CONN_MAX_AGE"] = env_int("SAPO_CONN_MAX_AGE", 0)
_default_db["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": _default_db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels --------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
# Namespace of every Redis key this deployment writes (channel layer, rate limits), so deployments
# or test runs sharing one Redis never count or deliver each other's messages.
SAPO_REDIS_PREFIX = env_str("SAPO_REDIS_PREFIX", "sapo")
if REDIS_URL:
    # socket_timeout None: redis-py >= 8 reads with a 5 s timeout by default, the same 5 s that
    # channels_redis blocks in BZPOPMIN waiting for messages, so an idle node socket would die with
    # a redis TimeoutError (close 1011) after 5 s of quiet.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": None}],
                "prefix": f"{SAPO_REDIS_PREFIX}:asgi",
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Accounts --------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # The JSON API serves the contributor's browser session; nodes authenticate on the WebSocket.
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "EXCEPTION_HANDLER": "common.errors.drf_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "SAPO Swarm API",
    "DESCRIPTION": "Contributor API of the SAPO Swarm platform. Nodes use the WebSocket protocol (docs/protocol.md).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}

# --- Static files, i18n ----------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"  # filled by `collectstatic` (the Docker image does it)
if not PRODUCTION:
    # Development serves from the finders; an absent STATIC_ROOT is expected there.
    warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)
STATICFILES_DIRS = [FRONTEND_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Logging ---------------------------------------------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("SAPO_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # runserver (daphne) prints its access log itself.
        "django.channels.server": {"level": "INFO", "propagate": False},
    },
}
