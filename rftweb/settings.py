"""The one settings module. DATABASE_URL / REDIS_URL choose Postgres / Redis; without them
the embedded default runs everything on one machine (SQLite, in-process broker and channel
layer)."""

from __future__ import annotations

import sys
from pathlib import Path

from rftweb.env import ConfigError, database_from_url, env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("RFT_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", True)
_DEV_SECRET = "rftweb-insecure-development-key-do-not-use-in-production"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    raise ConfigError("SECRET_KEY must be set when DEBUG is off")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
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
    "apps.runs",
    "apps.buffer",
    "apps.feedback",
    "apps.envapi",
    "apps.rewards",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

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
            ],
        },
    },
]

TESTING = "pytest" in sys.modules or (len(sys.argv) > 1 and sys.argv[1] == "test")
# Tests talk to the real services at their standard local ports unless told otherwise;
# RFT_TEST_EMBEDDED=1 runs them on the embedded default instead.
_TEST_REAL_SERVICES = TESTING and not env_bool("RFT_TEST_EMBEDDED", False)

DATABASE_URL = env_str("DATABASE_URL", "postgres://localhost:5432/test" if _TEST_REAL_SERVICES else "")
EMBEDDED = not DATABASE_URL
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "rftweb.sqlite3")),
            # Explorer, trainer and web share one file in the embedded default.
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
# Celery workers keep their database connection between tasks for this many seconds (with a
# health check before reuse): opening one per task cost each trainer and explorer step about
# 10 ms. Web processes keep Django's default of one connection per request, which async views
# need, and so does the embedded default, whose workers share the web's process. 0 turns it off.
RFT_WORKER_CONN_MAX_AGE = 0 if EMBEDDED else env_int("RFT_WORKER_CONN_MAX_AGE", 300)
# Celery's Django fixup would close every connection around every task; with reuse on, it
# only does so every this many tasks, and rftweb/celery.py applies Django's own age and
# health rules around each task instead.
CELERY_DB_REUSE_MAX = 1_000_000 if RFT_WORKER_CONN_MAX_AGE > 0 else None
# Several checkouts (worktrees, CI) may test against one Postgres server at once.
if env_str("TEST_DATABASE_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME")}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Tests (and the servers they start) hash passwords cheaply; never set this in production.
# Both hashers stay listed so either side can check what the other one stored.
if TESTING or env_bool("RFT_FAST_PASSWORD_HASHER", False):
    PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.MD5PasswordHasher",
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
    ]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "runs:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# Redis: Celery broker and the channel layer. Absent: in-process equivalents.
REDIS_URL = env_str("REDIS_URL", "redis://localhost:6379/0" if _TEST_REAL_SERVICES else "")
if REDIS_URL and env_str("RFT_CHANNEL_LAYER", "core") == "pubsub":
    # Redis pub/sub: one copy of a group message per process, fanned out in-process; no
    # backlog kept for absent listeners (live events are a view of the buffer). Measured
    # against the default in bench/live_stream.py.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": env_str("CHANNELS_PREFIX", "rftweb")},
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
elif REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # channels_redis blocks in BZPOPMIN for 5 s at a time and redis-py's default
                # socket timeout is 5 s too: the two race, and an idle consumer dies with
                # "Timeout reading from localhost:6379". Reads may take longer than the block.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "prefix": env_str("CHANNELS_PREFIX", "rftweb"),
                "capacity": 1000,
                "expiry": 30,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "rftweb.layers.EmbeddedChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_RESULT_BACKEND = "cache+memory://"

# The live stream (apps/runs/fanout.py) sends a busy run's events to each socket at most once
# per this many milliseconds, several events to a frame.
RFT_LIVE_FLUSH_MS = env_float("RFT_LIVE_FLUSH_MS", 15.0)

CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

# Where checkpoints and exports live: shared storage across hosts in production.
RFT_STORAGE_DIR = Path(env_str("RFT_STORAGE_DIR", str(VAR_DIR / "storage")))
# The demo model built by `manage.py rft_demo_model`.
RFT_DEMO_MODEL_DIR = Path(env_str("RFT_DEMO_MODEL_DIR", str(VAR_DIR / "demo-model")))
RFT_LEASE_SECONDS = env_int("RFT_LEASE_SECONDS", 300)
RFT_LEASE_REAP_SECONDS = env_float("RFT_LEASE_REAP_SECONDS", 30.0)
# The run conductor's beat, and how long a dispatched step is not dispatched again.
RFT_CONDUCT_SECONDS = env_float("RFT_CONDUCT_SECONDS", 0.5)
RFT_DISPATCH_TTL = env_float("RFT_DISPATCH_TTL", 120.0)
# The trainer task's time limit (seconds); the soft limit releases the batch first.
RFT_TRAIN_TIME_LIMIT = env_int("RFT_TRAIN_TIME_LIMIT", 1800)
# A trainer task goes on with the run's next steps while each is ready at once, starting none
# after this many seconds (then the queue, shared with other runs, has its turn). 0: one step
# a task.
RFT_TRAIN_CHAIN_SECONDS = min(env_float("RFT_TRAIN_CHAIN_SECONDS", 60.0), RFT_TRAIN_TIME_LIMIT / 2)
# Every how many train steps the trainer writes a full snapshot (weights, optimizer); the
# steps in between are journaled (their batch only) and replayed from the snapshot on restart.
RFT_TRAINER_SNAPSHOT_STEPS = env_int("RFT_TRAINER_SNAPSHOT_STEPS", 10)
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
RFT_MAX_BODY_BYTES = env_int("RFT_MAX_BODY_BYTES", 8 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = RFT_MAX_BODY_BYTES
# The longest the environment API waits for a rollout worker before answering 503.
RFT_ROLLOUT_TIMEOUT_SECONDS = env_float("RFT_ROLLOUT_TIMEOUT_SECONDS", 120.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"}},
}
