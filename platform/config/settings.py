"""Django settings for the SAPO Swarm platform. Every value that varies by deployment comes from the
environment, read here and nowhere else (helpers in common/env.py).

Environment:
  SAPO_ENV              "development" (default) or "production". Production requires
                        SAPO_SECRET_KEY, DATABASE_URL and SAPO_ALLOWED_HOSTS, turns DEBUG off and
                        SAPO_HTTPS on. README's configuration table lists every variable.
  SAPO_DEBUG            1/0; defaults to on in development, off in production.
  SAPO_SECRET_KEY       required in production; in development a key is generated once into
                        var/secret_key.
  SAPO_ALLOWED_HOSTS    comma-separated; required in production; development defaults to localhost names.
  SAPO_CSRF_TRUSTED_ORIGINS  comma-separated origins (https://sapo.example).
  SAPO_HTTPS            served over HTTPS (default: on in production): Secure cookies, HSTS, a redirect
                        of plain HTTP to HTTPS. SAPO_SSL_REDIRECT, SAPO_PROXY_SSL_HEADER, SAPO_HSTS_*
                        refine it (see the security block below).
  SAPO_CSP              the Content-Security-Policy header (default below; "" sends none).
  SAPO_STATIC_ROOT      where `collectstatic` puts static files (default <repo>/staticfiles).
  SAPO_METRICS_TOKEN    when set, /metrics requires `Authorization: Bearer <token>`.
  PROMETHEUS_MULTIPROC_DIR  a directory shared by the processes of one host: /metrics then sums them.
  DATABASE_URL          postgresql://...; unset (development only): the embedded PostgreSQL in
                        var/postgres on 127.0.0.1:SAPO_EMBEDDED_PG_PORT (54329, or the next free port
                        when another checkout holds it), see common/embedded_db.py.
  SAPO_DB_POOL_SIZE     PostgreSQL connections per server process (default 12): Django's psycopg
                        pool holds up to this many, and node sockets' database work runs on
                        SAPO_DB_POOL_SIZE - 2 threads (SAPO_DB_THREADS, common/db.py), the rest kept
                        for pages. Workers x size must stay under PostgreSQL's max_connections.
  SAPO_SHARE_SLOTS      batches of shares of one process verified and inserted at once (default 2);
                        the others wait, the nodes that cost the server least CPU lately first
                        (pool.turns).
  SAPO_SHARE_BATCH      shares of different nodes waiting at once that are stored together, in one
                        transaction (default 4; 1: each alone). A share's fixed cost is then paid once
                        per batch (pool.turns, pool.ingest.rollout_share_batch).
  SAPO_CONN_MAX_AGE     seconds a DB connection is kept (default 0). Set above 0, the pool is off and
                        each thread keeps its own connection that long (e.g. behind PgBouncer).
  SAPO_DB_PREPARE       1 (default): a share's three statements are prepared and planned once per
                        connection (common.db.prepare_hot). 0 behind a pooler that cannot keep prepared
                        statements (PgBouncer in transaction mode before 1.21, or without
                        max_prepared_statements).
  REDIS_URL             redis://...; unset: an in-memory channel layer (one process only).
  SAPO_SERVER_NAME      this server process's name in presence records (default: the host name); a
                        restarted process forgets its previous run's sockets by it (nodes.presence).
                        Give each process its own when several serve from one host.
  SAPO_ASGI_SERVER      daphne (default) or uvicorn: what `manage.py sapo_serve` runs (ops.serving).
  SAPO_PRESENCE_HEARTBEAT_SECONDS  how often an open node socket renews its presence record (default
                        20); a record counts for three heartbeats, so a killed process's nodes go
                        offline within 3x this (nodes.presence).
  SAPO_LOG_LEVEL        default INFO.
  Protocol limits (SAPO_MAX_*, SAPO_SAMPLE_WINDOW_SECONDS) and SAPO_CATALOGUE: SAPO_LIMITS and
                        SAPO_CATALOGUE below, see docs/protocol.md.
  Abuse limits (log-in, sign-up, nodes, tokens, API; SAPO_NUM_PROXIES): see docs/moderation.md#limits.
"""

from __future__ import annotations

import re
import secrets
import socket
import warnings
from pathlib import Path

from common.env import EnvError, env_bool, env_float, env_int, env_list, env_str, parse_database_url
from sapo_node.protocol import HELDOUT_MAX_NEW_TOKENS, HELDOUT_MAX_QUESTIONS, LIMIT_NAMES

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
if PRODUCTION and not ALLOWED_HOSTS:
    # Django would answer every request 400: fail at start-up instead, like a missing secret.
    raise EnvError("SAPO_ALLOWED_HOSTS must be set when SAPO_ENV=production (e.g. sapo.example.org)")
CSRF_TRUSTED_ORIGINS = env_list("SAPO_CSRF_TRUSTED_ORIGINS", [])

# --- Security: production is HTTPS-only by default (`manage.py check --deploy` is clean) ----------
# SAPO_HTTPS=0 is for a production profile without TLS, e.g. docker-compose.yml on one's own machine.
HTTPS = env_bool("SAPO_HTTPS", default=PRODUCTION)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
# Plain HTTP is redirected to HTTPS; turn off only when the proxy in front redirects already.
SECURE_SSL_REDIRECT = env_bool("SAPO_SSL_REDIRECT", default=HTTPS)
# Probes and scrapes come over plain HTTP from inside the network (ops.urls).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
# Behind a TLS-terminating proxy the request reaching daphne is HTTP: the proxy's X-Forwarded-Proto
# says whether the client used HTTPS. Only safe when the proxy sets that header and drops a client's.
if env_bool("SAPO_PROXY_SSL_HEADER", default=HTTPS):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("SAPO_HSTS_SECONDS", 31_536_000) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SAPO_HSTS_INCLUDE_SUBDOMAINS", default=True)
# Preloading asks browsers to hard-code HTTPS for the domain (hstspreload.org): the site owner's
# decision, so off by default, and the check that suggests it is silenced until it is on.
SECURE_HSTS_PRELOAD = env_bool("SAPO_HSTS_PRELOAD", default=False)
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Scripts, styles and everything else from the site only; no inline script or style, no eval (the
# templates and htmx's config in base.html keep to that; tests/browser checks every page). Not sent
# while DEBUG is on: Django's debug pages are inline HTML (ops.middleware).
DEFAULT_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)
CONTENT_SECURITY_POLICY = env_str("SAPO_CSP", DEFAULT_CSP)
# /metrics is open unless a token is set (keep it on the internal network either way; docs/deploy.md).
SAPO_METRICS_TOKEN = env_str("SAPO_METRICS_TOKEN", "")
PROMETHEUS_MULTIPROC_DIR = env_str("PROMETHEUS_MULTIPROC_DIR", "")

INSTALLED_APPS = [
    "daphne",  # first: `manage.py runserver` then serves HTTP and WebSockets (ASGI_APPLICATION)
    # Before django.contrib.auth: its `createsuperuser` names the account through accounts.services.
    "accounts",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served by the site (no CDN)
    "django_htmx",
    "channels",
    # Project apps (platform/<name>).
    "common",
    "ops",  # /healthz, /readyz, /metrics, the CSP header, deployment checks
    "swarms",  # training campaigns: below nodes and the pool (docs/architecture.md)
    "nodes",
    "pool",
    "localswarm",  # `manage.py sapo_local`, what `make run` starts
    # --- Added by other helpers: moderation, web. Keep the project apps above in this order. ---
    "moderation",
    "sockets",  # the node socket (parse, dispatch, close): above the pool, on moderation's layer
    "community",  # teams and badges: between moderation and web (docs/architecture.md)
    "alerts",  # after moderation, before web (tests/test_layers.py)
    "figures",  # statistics and the credit rule: above the pool and community, below web
    "audits",  # checkpoint audits of nodes' groups: above figures (it moves folded credit), below web
    "prebuilt",  # the built-in models served to nodes (/models/)
    "web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "ops.middleware.ContentSecurityPolicyMiddleware",
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
    from common.embedded_db import embedded_database_url

    _default_db = parse_database_url(embedded_database_url())
    # Same PostgreSQL backend, but it starts the embedded server before the first connection.
    _default_db["ENGINE"] = "config.embedded_backend"

# Connections come from Django's psycopg pool (OPTIONS "pool"): every node socket's database call
# borrows one for the call and gives it back, so a process needs no more connections than the threads
# that run those calls (common/db.py), and opening a socket costs no PostgreSQL connection set-up (with
# one connection per call, 1,000 sockets opening at once waited ~50 s: docs/benchmarks.md, "Sockets").
# SAPO_CONN_MAX_AGE > 0 turns the pool off for persistent per-thread connections instead (Django does
# not allow both). Health checks make a kept connection safe behind a pooler.
SAPO_DB_POOL_SIZE = env_int("SAPO_DB_POOL_SIZE", 12)
if SAPO_DB_POOL_SIZE < 3:
    raise EnvError(f"SAPO_DB_POOL_SIZE must be at least 3 (2 kept for pages), got {SAPO_DB_POOL_SIZE}")
#: Threads running node sockets' database calls (common.db.db_call); each holds at most one connection.
SAPO_DB_THREADS = SAPO_DB_POOL_SIZE - 2
#: How long a request or a socket's call waits for a database connection before it fails (a socket
#: opening then closes with 4503): while the database is down, every call waits this long.
SAPO_DB_POOL_TIMEOUT = env_float("SAPO_DB_POOL_TIMEOUT", 30.0)
#: While the database is down, the pool tries to reconnect at most this many seconds apart
#: (config.pg_backend): the site serves again within about this long of the database's return.
SAPO_DB_RECONNECT_SECONDS = env_float("SAPO_DB_RECONNECT_SECONDS", 1.0)
#: Prepare the statements every share runs (common.db.prepare_hot); off behind a pooler that drops them.
SAPO_DB_PREPARE = env_bool("SAPO_DB_PREPARE", True)
#: The per-item loops of a share in C (the sapo_native extension, native/; common.native) when it is
#: installed: the moderation rules' text work, the statements' arrays. Off (or not installed): their
#: Python and numpy twins, the same results at more CPU per share.
SAPO_NATIVE = env_bool("SAPO_NATIVE", True)
#: Batches of shares verified and inserted at once per process; waiting ones are ordered by their nodes'
#: recent CPU.
SAPO_SHARE_SLOTS = env_int("SAPO_SHARE_SLOTS", 2)
if not 1 <= SAPO_SHARE_SLOTS <= SAPO_DB_THREADS:
    raise EnvError(f"SAPO_SHARE_SLOTS must be 1..SAPO_DB_THREADS ({SAPO_DB_THREADS}), got {SAPO_SHARE_SLOTS}")
#: At most this many waiting shares (of different nodes) are stored together when a turn comes free.
SAPO_SHARE_BATCH = env_int("SAPO_SHARE_BATCH", 4)
if not 1 <= SAPO_SHARE_BATCH <= 64:
    raise EnvError(f"SAPO_SHARE_BATCH must be 1..64, got {SAPO_SHARE_BATCH}")
_default_db["CONN_MAX_AGE"] = env_int("SAPO_CONN_MAX_AGE", 0)
if _default_db["CONN_MAX_AGE"]:
    _default_db["CONN_HEALTH_CHECKS"] = True
else:
    # min_size: connections kept open while idle; timeout: how long a call waits for a free one. No
    # health check (with the pool it is a round trip on every borrow): a connection a PostgreSQL
    # restart broke fails its one call and the pool replaces it.
    _default_db["OPTIONS"]["pool"] = {"min_size": 2, "max_size": SAPO_DB_POOL_SIZE, "timeout": SAPO_DB_POOL_TIMEOUT}
    _default_db["CONN_HEALTH_CHECKS"] = False
if SAPO_DB_PREPARE:
    # psycopg ignores `prepare=True` while the threshold is None (Django's default, for poolers); a
    # threshold never reached lets common.db.prepare_hot's statements be prepared and nothing else
    # (Django's own cursors bind on the client and are never prepared).
    _default_db["OPTIONS"]["prepare_threshold"] = 2**31 - 1
DATABASES = {"default": _default_db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- The node protocol's limits and the pool's catalogue (docs/protocol.md, "Limits") -----------
# Read once, here: SAPO_<LIMIT NAME> for each limit set in the environment (the rest keep their
# defaults in pool.limits.Limits). Tests override SAPO_LIMITS / SAPO_CATALOGUE through settings.
SAPO_LIMITS = {
    name: env_int(f"SAPO_{name.upper()}", 0) for name in LIMIT_NAMES if (env_str(f"SAPO_{name.upper()}") or "").strip()
}
SAPO_CATALOGUE = env_str("SAPO_CATALOGUE", "") or "sapo"
# How long a server process keeps a swarm's settings before reading them again (sockets.swarm_places; a
# staff change reaches every process at once regardless). Tests whose database is emptied between
# them set 0, so no process keeps a swarm that no longer exists.
SAPO_SWARM_PLACE_SECONDS = env_float("SAPO_SWARM_PLACE_SECONDS", 5.0)
# How often each server process reads the socket orders (closes, swarms' changes: nodes.events) from the
# database: the longest an order takes to reach an open socket when the channel layer did not carry it.
SAPO_SOCKET_ORDERS_SECONDS = env_float("SAPO_SOCKET_ORDERS_SECONDS", 2.0)
# Challenges (docs/protocol.md, "Proof of work"): a node socket gets a fresh one at most every
# SAPO_CHALLENGE_SECONDS (the current one again otherwise, so a node cannot shop among many), and a
# group may answer one until SAPO_CHALLENGE_TTL_SECONDS after it was issued (later: unaudited, no credit).
SAPO_CHALLENGE_SECONDS = env_float("SAPO_CHALLENGE_SECONDS", 20.0)
SAPO_CHALLENGE_TTL_SECONDS = env_int("SAPO_CHALLENGE_TTL_SECONDS", 86_400)
if SAPO_CHALLENGE_SECONDS < 0 or SAPO_CHALLENGE_TTL_SECONDS <= 0:
    raise EnvError("SAPO_CHALLENGE_SECONDS must be at least 0 and SAPO_CHALLENGE_TTL_SECONDS positive")
# Held-out checks (docs/protocol.md, "heldout_check"): a node socket whose hello says `heldout` is asked
# SAPO_HELDOUT_QUESTIONS questions of its swarm's held-out stream after every SAPO_HELDOUT_EVERY_ROUNDS
# rounds it reports (0: never), at most once every SAPO_HELDOUT_MIN_SECONDS, answers of at most
# SAPO_HELDOUT_MAX_NEW_TOKENS tokens, due SAPO_HELDOUT_DEADLINE_SECONDS after they were asked.
SAPO_HELDOUT_EVERY_ROUNDS = env_int("SAPO_HELDOUT_EVERY_ROUNDS", 10)
SAPO_HELDOUT_MIN_SECONDS = env_float("SAPO_HELDOUT_MIN_SECONDS", 30.0)
SAPO_HELDOUT_QUESTIONS = env_int("SAPO_HELDOUT_QUESTIONS", 4)
SAPO_HELDOUT_MAX_NEW_TOKENS = env_int("SAPO_HELDOUT_MAX_NEW_TOKENS", 64)
SAPO_HELDOUT_DEADLINE_SECONDS = env_float("SAPO_HELDOUT_DEADLINE_SECONDS", 300.0)
if not (
    SAPO_HELDOUT_EVERY_ROUNDS >= 0
    and SAPO_HELDOUT_MIN_SECONDS >= 0
    and 1 <= SAPO_HELDOUT_QUESTIONS <= HELDOUT_MAX_QUESTIONS
    and 1 <= SAPO_HELDOUT_MAX_NEW_TOKENS <= HELDOUT_MAX_NEW_TOKENS
    and SAPO_HELDOUT_DEADLINE_SECONDS > 0
):
    raise EnvError(
        "SAPO_HELDOUT_EVERY_ROUNDS and SAPO_HELDOUT_MIN_SECONDS must be at least 0, SAPO_HELDOUT_QUESTIONS in "
        f"[1, {HELDOUT_MAX_QUESTIONS}], SAPO_HELDOUT_MAX_NEW_TOKENS in [1, {HELDOUT_MAX_NEW_TOKENS}] "
        "and SAPO_HELDOUT_DEADLINE_SECONDS positive"
    )
# G of the group-worth bound (figures.credit, docs/figures.md): a group of n completions is credited
# its verified rewards' sum times min(1, G / n), so more completions per group earn no more credit.
SAPO_CREDIT_COMPLETIONS = env_int("SAPO_CREDIT_COMPLETIONS", 8)
if SAPO_CREDIT_COMPLETIONS < 1:
    raise EnvError(f"SAPO_CREDIT_COMPLETIONS must be at least 1, got {SAPO_CREDIT_COMPLETIONS}")

# --- The pool's text retention (docs/deploy.md, "Text retention and archives") ------------------
# A group's texts (question, answer, completions) are kept this many days, then written to
# SAPO_ARCHIVE_DIR (one gzip file per day) and dropped by the scheduled job `retention`; its ledger
# row (every figure's source) is kept for good. Longer than the sampling window, or a group could age
# out while it is still sampled.
SAPO_TEXT_RETENTION_DAYS = env_int("SAPO_TEXT_RETENTION_DAYS", 14)
_WINDOW_DAYS = SAPO_LIMITS.get("sample_window_seconds", 86_400) / 86_400
if not _WINDOW_DAYS < SAPO_TEXT_RETENTION_DAYS <= 36_500:
    raise EnvError(
        f"SAPO_TEXT_RETENTION_DAYS must be longer than the sampling window ({_WINDOW_DAYS:g} days) and at most"
        f" 36,500, got {SAPO_TEXT_RETENTION_DAYS}"
    )
# Texts are dropped only once archived, unless the operator says they may go without an archive: a site
# that sets nothing archives under its var dir, so its database stays bounded and loses no text.
# SAPO_ARCHIVE_DIR set empty: no archive, and the texts stay unless SAPO_RETENTION_UNARCHIVED=drop.
SAPO_ARCHIVE_DIR = env_str("SAPO_ARCHIVE_DIR")
if SAPO_ARCHIVE_DIR is None:
    SAPO_ARCHIVE_DIR = str(VAR_DIR / "archive")
elif not SAPO_ARCHIVE_DIR.strip():
    SAPO_ARCHIVE_DIR = ""
elif not Path(SAPO_ARCHIVE_DIR).is_absolute():  # the job's working directory is no place to look for it
    raise EnvError(f"SAPO_ARCHIVE_DIR must be an absolute path or empty, got {SAPO_ARCHIVE_DIR!r}")
SAPO_RETENTION_UNARCHIVED = env_str("SAPO_RETENTION_UNARCHIVED", "") or "keep"
if SAPO_RETENTION_UNARCHIVED not in ("keep", "drop"):
    raise EnvError(f"SAPO_RETENTION_UNARCHIVED must be keep or drop, got {SAPO_RETENTION_UNARCHIVED!r}")
if SAPO_RETENTION_UNARCHIVED == "drop" and SAPO_ARCHIVE_DIR:
    # Two answers to one question: refused rather than guessed.
    raise EnvError(
        f"SAPO_RETENTION_UNARCHIVED=drop needs SAPO_ARCHIVE_DIR empty (it is {SAPO_ARCHIVE_DIR!r}): set"
        " SAPO_ARCHIVE_DIR= to drop texts without an archive, or unset SAPO_RETENTION_UNARCHIVED to archive them"
    )

# --- Audits: a node's committed weights replayed by a worker (docs/audits.md) ----------------------
# The chance that a node's new weights digest is audited (its first one always is), and the factor
# for nodes younger than a day, nodes the outlier rule flagged and the top tenth by pending credit.
SAPO_AUDIT_RATE = env_float("SAPO_AUDIT_RATE", 0.05)
SAPO_AUDIT_BOOST = env_float("SAPO_AUDIT_BOOST", 4.0)
if not (0 <= SAPO_AUDIT_RATE <= 1 and SAPO_AUDIT_BOOST >= 1):
    raise EnvError(
        f"SAPO_AUDIT_RATE must be in [0, 1] and SAPO_AUDIT_BOOST at least 1, got {SAPO_AUDIT_RATE}, {SAPO_AUDIT_BOOST}"
    )
# Per model, the rate that stands for SAPO_AUDIT_RATE ("smollm2-135m=0.01,tiny-mini=0.05"); a model not
# named gets SAPO_AUDIT_RATE scaled down by its measured audit cost (audits.selection.model_rate).
SAPO_AUDIT_RATES: dict[str, float] = {}
for _pair in env_list("SAPO_AUDIT_RATES"):
    _model, _, _rate = _pair.partition("=")
    _model = _model.strip()
    if _model in SAPO_AUDIT_RATES:  # which of the two was meant is not ours to guess
        raise EnvError(f"SAPO_AUDIT_RATES: {_model!r} is named twice")
    try:
        SAPO_AUDIT_RATES[_model] = float(_rate)
    except ValueError:
        raise EnvError(f"SAPO_AUDIT_RATES: expected model=rate pairs, got {_pair!r}") from None
    if not (_model and 0 <= SAPO_AUDIT_RATES[_model] <= 1):
        raise EnvError(f"SAPO_AUDIT_RATES: a model name and a rate in [0, 1], got {_pair!r}")
# Seconds a node has to upload the checkpoint an audit asks for (a node offline meanwhile has this
# long, not an instant penalty).
SAPO_AUDIT_DEADLINE_SECONDS = env_int("SAPO_AUDIT_DEADLINE_SECONDS", 3600)
# Bounds of an upload: the whole file, and chunk requests per node per minute (a chunk is at most
# audits.upload.MAX_CHUNK_BYTES).
SAPO_AUDIT_MAX_CHECKPOINT_BYTES = env_int("SAPO_AUDIT_MAX_CHECKPOINT_BYTES", 1 << 30)
SAPO_AUDIT_CHUNKS_PER_MINUTE = env_int("SAPO_AUDIT_CHUNKS_PER_MINUTE", 240)
# Groups an audit replays at most (a sample of those it covers), and tokens it replays at most.
SAPO_AUDIT_GROUPS = env_int("SAPO_AUDIT_GROUPS", 4)
SAPO_AUDIT_MAX_TOKENS = env_int("SAPO_AUDIT_MAX_TOKENS", 16_384)
# Seconds after which an uploaded audit whose job has not finished is queued again by the sweep (a
# worker that crashed mid-job loses no audit), and how many times before it fails as lost.
SAPO_AUDIT_JOB_LEASE_SECONDS = env_int("SAPO_AUDIT_JOB_LEASE_SECONDS", 900)
SAPO_AUDIT_JOB_ATTEMPTS = env_int("SAPO_AUDIT_JOB_ATTEMPTS", 3)
# How long an errored audit keeps its upload for staff to run it again (`manage.py sapo_audit_rerun`,
# the admin's action), and the bytes all kept uploads may take: the sweep deletes any older, and the
# oldest past the bytes (a fault that errors every audit must not fill the disk).
SAPO_AUDIT_ERRORED_KEEP_SECONDS = env_int("SAPO_AUDIT_ERRORED_KEEP_SECONDS", 7 * 86_400)
SAPO_AUDIT_ERRORED_KEEP_BYTES = env_int("SAPO_AUDIT_ERRORED_KEEP_BYTES", 20 << 30)
# Where uploads are written (private to the site) and where the worker keeps the built-in models.
SAPO_AUDIT_UPLOAD_DIR = Path(env_str("SAPO_AUDIT_UPLOAD_DIR") or VAR_DIR / "audits")
SAPO_AUDIT_MODEL_CACHE = Path(env_str("SAPO_AUDIT_MODEL_CACHE") or VAR_DIR / "audit-models")
# The built-in models the site builds once and serves to nodes (`manage.py sapo_models build`, /models/).
SAPO_PREBUILT_DIR = Path(env_str("SAPO_PREBUILT_DIR") or VAR_DIR / "models")

# --- Channels --------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
# Namespace of every Redis key this deployment writes (channel layer, rate limits), so deployments
# or test runs sharing one Redis never count or deliver each other's messages.
SAPO_REDIS_PREFIX = env_str("SAPO_REDIS_PREFIX", "sapo")
# Seconds a Redis connection may take to open and a command to be answered, in every client
# (common.redis_client): what a Redis that hangs costs a frame, a socket's opening or a page before
# the site degrades as for a stopped one (docs/deploy.md, "When Redis fails").
SAPO_REDIS_TIMEOUT_SECONDS = env_float("SAPO_REDIS_TIMEOUT_SECONDS", 0.5)
if not 0 < SAPO_REDIS_TIMEOUT_SECONDS <= 60:
    raise EnvError(f"SAPO_REDIS_TIMEOUT_SECONDS must be above 0 and at most 60, got {SAPO_REDIS_TIMEOUT_SECONDS}")
SAPO_SERVER_NAME = env_str("SAPO_SERVER_NAME", "") or socket.gethostname()
# The ASGI server `manage.py sapo_serve` runs (ops.serving; docs/deploy.md, "Processes").
SAPO_ASGI_SERVER = env_str("SAPO_ASGI_SERVER", "daphne")
if SAPO_ASGI_SERVER not in ("uvicorn", "daphne"):
    raise EnvError(f"SAPO_ASGI_SERVER must be uvicorn or daphne, got {SAPO_ASGI_SERVER!r}")
SAPO_PRESENCE_HEARTBEAT_SECONDS = env_int("SAPO_PRESENCE_HEARTBEAT_SECONDS", 20)
if REDIS_URL:
    # Its commands bounded by SAPO_REDIS_TIMEOUT_SECONDS, its wait for a message (5 s) by twice that
    # wait (common/channel_layers.py).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "common.channel_layers.BoundedRedisChannelLayer",  # on a bounded pool
            "CONFIG": {
                "hosts": [{"address": REDIS_URL}],
                "prefix": f"{SAPO_REDIS_PREFIX}:asgi",
            },
        }
    }
else:
    # Channels' in-memory layer, its clean-up of expired messages throttled (common/channel_layers.py).
    CHANNEL_LAYERS = {"default": {"BACKEND": "common.channel_layers.ThrottledInMemoryChannelLayer"}}

# --- Accounts --------------------------------------------------------------------------------
AUTH_USER_MODEL = "accounts.User"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"
AUTHENTICATION_BACKENDS = ["accounts.backends.LimitedModelBackend"]  # ModelBackend behind the log-in limiter
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "accounts.passwords.MaximumLengthValidator"},  # first: the others then never see a huge one
    {
        "NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator",
        "OPTIONS": {"user_attributes": ("username", "display_name", "first_name", "last_name", "email")},
    },
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- Abuse limits (docs/moderation.md#limits) ------------------------------------------------
# Counted by accounts/limits.py in Redis when REDIS_URL is set, else in PostgreSQL: either way shared
# by every server process.
SAPO_NUM_PROXIES = env_int("SAPO_NUM_PROXIES", 0)  # reverse proxies in front of the site (X-Forwarded-For)
SAPO_LOGIN_FAILURES_PER_USER = env_int("SAPO_LOGIN_FAILURES_PER_USER", 10)
SAPO_LOGIN_FAILURES_PER_ADDRESS = env_int("SAPO_LOGIN_FAILURES_PER_ADDRESS", 30)
SAPO_LOGIN_WINDOW_SECONDS = env_int("SAPO_LOGIN_WINDOW_SECONDS", 900)
SAPO_SIGNUPS_PER_ADDRESS_PER_HOUR = env_int("SAPO_SIGNUPS_PER_ADDRESS_PER_HOUR", 10)
SAPO_NODES_PER_ACCOUNT = env_int("SAPO_NODES_PER_ACCOUNT", 20)
SAPO_NODE_CREATIONS_PER_HOUR = env_int("SAPO_NODE_CREATIONS_PER_HOUR", 20)
SAPO_TOKEN_ROTATIONS_PER_HOUR = env_int("SAPO_TOKEN_ROTATIONS_PER_HOUR", 10)
SAPO_TEAMS_PER_ACCOUNT_PER_MONTH = env_int("SAPO_TEAMS_PER_ACCOUNT_PER_MONTH", 3)
SAPO_TEAMS_PER_ADDRESS_PER_DAY = env_int("SAPO_TEAMS_PER_ADDRESS_PER_DAY", 5)
SAPO_TEAM_MOVES_PER_ACCOUNT_PER_DAY = env_int("SAPO_TEAM_MOVES_PER_ACCOUNT_PER_DAY", 10)

# --- The daily statistics export (docs/figures.md#daily-statistics-export) ----------------
# Written by the scheduled job `export` and `manage.py sapo_stats export`; served at /stats/. Every
# site process must see the same folder (a shared volume when they run on several machines).
SAPO_STATS_EXPORT_DIR = Path(env_str("SAPO_STATS_EXPORT_DIR") or VAR_DIR / "stats")


def _api_rate(name: str, default: str) -> str:
    rate = env_str(name, default).strip()
    if not re.fullmatch(r"[1-9][0-9]*/(s|m|h|d|(sec|second|min|minute|hour|day)s?)", rate):
        raise EnvError(f"{name}={rate!r} is not a rate such as 120/min (periods: sec, min, hour, day)")
    return rate


SAPO_API_RATE_ANON = _api_rate("SAPO_API_RATE_ANON", "120/min")
SAPO_API_RATE_USER = _api_rate("SAPO_API_RATE_USER", "600/min")

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # The JSON API serves the contributor's browser session; nodes authenticate on the WebSocket.
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"]
    + (["rest_framework.renderers.BrowsableAPIRenderer"] if DEBUG else []),
    "EXCEPTION_HANDLER": "common.errors.drf_exception_handler",
    # DRF's parsers, JSON's with its nesting bounded (common.json_input)
    "DEFAULT_PARSER_CLASSES": [
        "common.json_input.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["accounts.throttling.UserThrottle", "accounts.throttling.AnonThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": SAPO_API_RATE_USER, "anon": SAPO_API_RATE_ANON},
    "NUM_PROXIES": SAPO_NUM_PROXIES,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "SAPO Swarm API",
    "DESCRIPTION": "Contributor API of the SAPO Swarm platform. Nodes use the WebSocket protocol (docs/protocol.md).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Static files, i18n ----------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = Path(
    env_str("SAPO_STATIC_ROOT") or BASE_DIR / "staticfiles"
)  # filled by `collectstatic` (docs/deploy.md)
if not PRODUCTION:
    # Development serves from the finders; an absent STATIC_ROOT is expected there.
    warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)
STATICFILES_DIRS = [FRONTEND_DIR / "static"]
# Django's two, a path climbing out of their folders not found (404) rather than an error (500).
STATICFILES_FINDERS = ["ops.staticfiles.FileSystemFinder", "ops.staticfiles.AppDirectoriesFinder"]
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

# --- Email and alerts (docs/deploy.md, "Email") ------------------------------------------------
# Development prints emails on the console (or writes files: SAPO_EMAIL_BACKEND=file); production
# sends them by SMTP. Django's tests swap in its in-memory backend.
_EMAIL_BACKENDS = {
    "console": "django.core.mail.backends.console.EmailBackend",
    "file": "django.core.mail.backends.filebased.EmailBackend",
    "smtp": "django.core.mail.backends.smtp.EmailBackend",
}
_email_backend = env_str("SAPO_EMAIL_BACKEND", "smtp" if PRODUCTION else "console")
if _email_backend not in _EMAIL_BACKENDS:
    raise EnvError(f"SAPO_EMAIL_BACKEND must be one of {sorted(_EMAIL_BACKENDS)}, got {_email_backend!r}")
EMAIL_BACKEND = _EMAIL_BACKENDS[_email_backend]
EMAIL_FILE_PATH = env_str("SAPO_EMAIL_FILE_PATH", str(VAR_DIR / "emails"))
EMAIL_HOST = env_str("SAPO_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("SAPO_EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("SAPO_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = env_str("SAPO_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("SAPO_EMAIL_TLS", default=True)  # STARTTLS on 587
EMAIL_USE_SSL = env_bool("SAPO_EMAIL_SSL", default=False)  # implicit TLS, usually 465
EMAIL_TIMEOUT = env_int("SAPO_EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("SAPO_EMAIL_FROM", "SAPO Swarm <alerts@localhost>")
#: Messages (alerts and recoveries) one contributor gets per 24 hours at most; later ones are listed only.
SAPO_ALERT_DAILY_CAP = env_int("SAPO_ALERT_DAILY_CAP", 20)
#: Seconds a webhook delivery may take to connect, and to answer.
SAPO_ALERT_WEBHOOK_TIMEOUT = env_float("SAPO_ALERT_WEBHOOK_TIMEOUT", 5.0)
#: Seconds one webhook delivery may take in all, attempts and pauses included (alerts/webhooks.py).
SAPO_ALERT_WEBHOOK_DEADLINE = env_float("SAPO_ALERT_WEBHOOK_DEADLINE", 20.0)
#: Messages an alerts check sends at once: a slow receiver holds up only its own.
SAPO_ALERT_SEND_THREADS = env_int("SAPO_ALERT_SEND_THREADS", 8)
#: Networks a webhook may reach despite not being public. Empty, and not read from the environment:
#: only the tests set it, to reach a server of their own on 127.0.0.1 (alerts/webhooks.py).
SAPO_ALERT_WEBHOOK_ALLOWED_NETWORKS: list[str] = []

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
