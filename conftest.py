"""Test defaults: the services at their standard local ports unless told otherwise (`make
test` starts a PostgreSQL and a Redis of its own where none answers there:
scripts/services.py). Exported so that child processes (Celery workers, servers) started by
tests see the same services. Several checkouts can test at once against one Postgres and one
Redis: TEST_DATABASE_NAME and REDIS_URL's database number keep them apart."""

import os

os.environ.setdefault("DATABASE_URL", "postgres://localhost:5432/test")
os.environ.setdefault("REDIS_URL", "redis://localhost:6379/0")
os.environ.setdefault("RFT_FAST_PASSWORD_HASHER", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Playwright's sync API runs an event loop on the test thread; the ORM calls the page tests
# make between browser steps are still synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

# Live servers, Celery workers and the browser: one module for every test (tests/servers.py);
# how `make test`'s xdist workers share the tests out (tests/xdist_schedule.py).
pytest_plugins = ["tests.servers", "tests.xdist_schedule", "tests.cost_log"]
