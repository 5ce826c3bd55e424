from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from rftweb.env import ConfigError, database_from_url, env_bool, env_int

ROOT = Path(__file__).resolve().parent.parent


_XDIST_PROBE = """
import json, os, pytest  # pytest imported: the settings see a test process
from django.conf import settings
settings.REDIS_URL
print(json.dumps({"redis": settings.REDIS_URL, "cache": settings.CACHES["default"]["LOCATION"],
                  "broker": settings.CELERY_BROKER_URL, "var": str(settings.VAR_DIR),
                  "storage": str(settings.RFT_STORAGE_DIR), "env_redis": os.environ["REDIS_URL"],
                  "env_var": os.environ["RFT_VAR_DIR"], "worker": os.environ.get("PYTEST_XDIST_WORKER")}))
"""


def _xdist_settings(worker: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RFT_VAR_DIR", "RFT_STORAGE_DIR"}}
    env.update(PYTEST_XDIST_WORKER=worker, REDIS_URL="redis://localhost:6379/13", RFT_VAR_DIR=str(tmp_path),
               DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", _XDIST_PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_each_xdist_worker_tests_on_a_redis_database_and_var_dir_of_its_own(tmp_path: Path) -> None:
    import json

    gw0, gw1 = (json.loads(_xdist_settings(w, tmp_path).stdout.strip().splitlines()[-1]) for w in ("gw0", "gw1"))
    assert gw0["redis"] == gw0["cache"] == gw0["broker"] == gw0["env_redis"] == "redis://localhost:6379/13"
    # + 4 × N (mod 16): the workers' benches (+ 2 of each: 15, 3, 7, 11) apart from all four.
    assert gw1["redis"] == gw1["cache"] == gw1["broker"] == gw1["env_redis"] == "redis://localhost:6379/1"
    assert gw0["var"] == gw0["env_var"] == str(tmp_path / "xdist-gw0") and gw0["storage"] == str(tmp_path / "xdist-gw0" / "storage")
    assert gw1["var"] == gw1["env_var"] == str(tmp_path / "xdist-gw1")
    # Taken out of the environment: a process the test starts (a nested pytest) moves no further.
    assert gw0["worker"] is None and gw1["worker"] is None
    assert json.loads(_xdist_settings("gw3", tmp_path).stdout.strip().splitlines()[-1])["redis"] == "redis://localhost:6379/9"
    refused = _xdist_settings("gw4", tmp_path)
    assert refused.returncode != 0 and "at most 4 workers" in refused.stderr


def test_the_test_run_uses_postgres_and_redis() -> None:
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "rftweb.layers.RedisBatchChannelLayer"
    assert settings.CELERY_BROKER_URL.startswith("redis://")


def test_database_urls_are_parsed_and_bad_ones_named() -> None:
    db = database_from_url("postgres://bob:s%40cret@db.example:6543/rft")
    # Web processes (ASGI, a thread per request) keep no connection between requests.
    assert db["CONN_MAX_AGE"] == 0
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == ("bob", "s@cret", "db.example", "6543", "rft")
    with pytest.raises(ConfigError, match="scheme 'mysql'"):
        database_from_url("mysql://localhost/x")
    with pytest.raises(ConfigError, match="names no database"):
        database_from_url("postgres://localhost/")


def test_typed_env_helpers_reject_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_FLAG", "maybe")
    with pytest.raises(ConfigError, match="X_FLAG='maybe' is not a boolean"):
        env_bool("X_FLAG")
    monkeypatch.setenv("X_NUM", "ten")
    with pytest.raises(ConfigError, match="X_NUM='ten' is not an integer"):
        env_int("X_NUM", 1)


def test_the_development_secret_refuses_to_start_with_debug_off() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SECRET_KEY"}
    env.update(DEBUG="0")
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in proc.stderr
    env["SECRET_KEY"] = "a-real-secret-for-this-test-only-1234567890"
    proc = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_deployments_settings_module_that_extends_ours_loads_and_its_values_reach_celery(tmp_path: Path) -> None:
    # The usual way to deploy: a site module with `from rftweb.settings import *` and overrides.
    # Importing rftweb.settings imports rftweb, hence the Celery app, half-way through the site
    # module's own import: the app must read its settings later (bench/env_api's settings module
    # failed this way, at import, for rounds).
    (tmp_path / "site_settings.py").write_text("from rftweb.settings import *\n\nRFT_CONDUCT_SECONDS = 2.5\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "site_settings", "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    code = ("import django; django.setup(); from rftweb.celery import app; "
            "print(app.conf.beat_schedule['conductor-beat']['schedule'], app.conf.timezone)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["2.5", settings.TIME_ZONE]


def _environment_reads(path: Path) -> list[str]:
    """Where a module reads the environment or a setting with a fallback default, as
    'path:line'; writes (os.environ.setdefault for a library) and copies for a child
    process are not reads of a setting."""
    import ast

    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        target = None
        if isinstance(node, ast.Call):
            func = node.func
            text = ast.unparse(func)
            if text in {"os.environ.get", "os.getenv", "environ.get", "getenv"}:
                target = text
            elif text == "getattr" and node.args and ast.unparse(node.args[0]) == "settings":
                target = "getattr(settings, …)"
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and ast.unparse(node.value) == "os.environ":
            target = "os.environ[…]"
        if target:
            found.append(f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')} {target}")
    return found


def test_settings_are_read_from_the_environment_only_in_the_settings_module() -> None:
    # The client (rftweb/client.py) runs in an environment's process, not the server's: its
    # RFT_URL and RFT_API_KEY are that script's command-line defaults, not settings.
    allowed = {ROOT / "rftweb" / "settings.py", ROOT / "rftweb" / "env.py", ROOT / "rftweb" / "client.py"}
    reads = [
        read
        for folder in ("kernel", "apps", "workers", "rftweb")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in allowed
        for read in _environment_reads(path)
    ]
    assert reads == [], "read these through rftweb/settings.py and its typed helpers: " + ", ".join(reads)


def test_every_variable_the_settings_read_is_described_in_the_docs() -> None:
    """docs/_snippets/settings-notes.md holds the meaning of each setting, which
    scripts/docs_reference.py joins with the code's defaults into the settings reference page:
    a variable read without a row, or a row naming one no longer read, fails here."""
    import ast
    import re

    helpers = {"env_str", "env_bool", "env_int", "env_float", "env_list"}
    tree = ast.parse((ROOT / "rftweb" / "settings.py").read_text())
    names = {
        str(node.args[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in helpers
        and node.args and isinstance(node.args[0], ast.Constant)
    }
    # A row's first cell names one variable or several (`A`, `B`).
    notes = ROOT / "docs" / "_snippets" / "settings-notes.md"
    first_cells = re.findall(r"^\| ((?:`[A-Z0-9_]+`(?:, )?)+) \|", notes.read_text(), flags=re.MULTILINE)
    documented = [name for cell in first_cells for name in re.findall(r"`([A-Z0-9_]+)`", cell)]
    assert names - set(documented) == set(), f"missing from {notes.name}: {sorted(names - set(documented))}"
    assert set(documented) - names == set(), f"in {notes.name} but not read by rftweb/settings.py: {sorted(set(documented) - names)}"
    assert len(documented) == len(set(documented)), f"described twice in {notes.name}"


def test_the_console_drops_celerys_info_lines_about_the_loop_beat_and_keeps_the_rest() -> None:
    """The loop's beat runs every RFT_CONDUCT_SECONDS: Celery's INFO lines about it (sent by
    beat, received and succeeded by the worker) would be six lines a second. Other tasks'
    lines, and any warning about the beat, still reach the console."""
    import logging
    import logging.config

    from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS

    stream = __import__("io").StringIO()
    configured: dict[str, Any] = dict(settings.LOGGING)
    config: dict[str, Any] = {**configured, "disable_existing_loggers": False, "root": {"handlers": [], "level": "INFO"}}
    config["handlers"] = {"console": {**configured["handlers"]["console"], "stream": stream}}
    config["loggers"] = {name: {"handlers": ["console"], "level": "INFO", "propagate": False}
                         for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")}
    logging.config.dictConfig(config)
    try:
        beat, received, trace = (logging.getLogger(n) for n in ("celery.beat", "celery.worker.strategy", "celery.app.trace"))
        for task in ("apps.control.conductor_beat.conductor_beat_task", "workers.trainer.task.train_step"):
            context = {"id": "x1", "name": task}
            beat.info("Scheduler: Sending due task %s (%s)", "entry", task)
            received.info(LOG_RECEIVED, context, extra={"data": context})
            trace.info(LOG_SUCCESS, {**context, "return_value": "[]", "runtime": 0.01, "args": "()", "kwargs": "{}"})
        trace.warning("Task %(name)s[%(id)s] raised", {"id": "x2", "name": "apps.control.conductor_beat.conductor_beat_task"})
    finally:
        logging.config.dictConfig(settings.LOGGING)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines
    assert sum("workers.trainer.task.train_step" in line for line in lines) == 3
    assert "raised" in lines[-1]
