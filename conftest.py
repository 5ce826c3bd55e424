"""Test defaults. The database and Redis defaults live in rftweb/settings.py (tests use the
real services unless RFT_TEST_EMBEDDED=1); several checkouts can test at once against one
Postgres and one Redis: TEST_DATABASE_NAME and REDIS_URL's database number keep them apart."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
