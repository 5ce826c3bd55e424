"""Test defaults: the real services at their standard local ports, unless told otherwise.

Several checkouts may test at once against one Postgres and one Redis: TEST_DATABASE_NAME
and REDIS_URL's database number keep them apart.
"""

import os

if os.environ.get("RFT_TEST_EMBEDDED") != "1":
    os.environ.setdefault("DATABASE_URL", "postgres://localhost:5432/test")
    os.environ.setdefault("REDIS_URL", "redis://localhost:6379/0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
