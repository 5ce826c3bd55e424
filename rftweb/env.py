"""Small typed readers for environment variables, the only way settings read the environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from kernel.exceptions import InvalidInput


N = TypeVar("N", int, float)


class ConfigError(InvalidInput, RuntimeError):
    """A setting in the environment is missing or malformed."""

    code = "config_error"


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def _env_number(name: str, default: N, cast: Callable[[str], N], what: str) -> N:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {what}") from None


def env_int(name: str, default: int) -> int:
    return _env_number(name, default, int, "an integer")


def env_float(name: str, default: float) -> float:
    return _env_number(name, default, float, "a number")


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict[str, object]:
    """Django's DATABASES entry for a postgres:// (or postgresql://) URL."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ConfigError(f"DATABASE_URL scheme {parts.scheme!r} is not supported; use postgres://")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ConfigError("DATABASE_URL names no database (postgres://user@host:5432/NAME)")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # 0: one connection a request. Under ASGI every request runs in its own thread, so a
        # kept connection per thread exhausted Postgres's slots (issue #33: 94 held, 500s).
        # Celery workers raise it to RFT_WORKER_CONN_MAX_AGE in rftweb/celery.py.
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
    }


def redis_database_moved(url: str, by: int) -> str:
    """`url` (redis://host:port/N) on database N + `by` of the same server (mod 16, Redis's
    default count)."""
    from urllib.parse import urlunsplit

    parts = urlsplit(url)
    number = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(number + by) % 16}"))
