"""Shared set-up for benches: a dedicated Postgres database, migrated, and Django ready."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = os.environ.get("BENCH_DATABASE_URL", "postgres://localhost:5432/rftweb_bench")
# Where benches find (or build) the demo model; the smoke tests point it at the tests' build.
DEMO_DIR = Path(os.environ.get("BENCH_DEMO_DIR", str(ROOT / ".cache" / "demo-model")))


def setup_django(*, database_url: str = BENCH_DB, migrate: bool = True) -> None:
    """Point Django at the bench database (created when missing) and migrate it."""
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", "redis://localhost:6379/15")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rftweb.settings")
    _ensure_database(database_url)
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


def _ensure_database(url: str) -> None:
    from urllib.parse import urlsplit

    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
