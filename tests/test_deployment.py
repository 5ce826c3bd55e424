"""docker-compose.yml names real commands and the queues the Celery app routes to."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from rftweb.celery import QUEUES, app

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_every_service_command_is_a_real_program() -> None:
    for name, service in _compose()["services"].items():
        command = service.get("command")
        if command is None:
            continue
        program = command[0]
        assert program in {"redis-server"} or (BIN / program).exists() or shutil.which(program), f"{name}: {program}"
        if command[:2] == ["python", "manage.py"]:
            from django.core.management import get_commands

            assert command[2] in get_commands(), f"{name}: manage.py {command[2]}"


def test_there_is_one_worker_per_queue_and_gpu_reservations_for_rollout_and_train() -> None:
    services = _compose()["services"]
    served = {}
    for name, service in services.items():
        command = service.get("command") or []
        if command[:4] == ["celery", "-A", "rftweb", "worker"]:
            served[command[command.index("-Q") + 1]] = service
    assert set(served) == set(QUEUES)
    for queue in ("rollout", "train"):
        devices = served[queue]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"]
    assert "deploy" not in served["default"]


def test_tasks_route_to_their_queues() -> None:
    router = app.amqp.router
    assert router.route({}, "workers.explorer.explore_step")["queue"].name == "rollout"
    assert router.route({}, "workers.trainer.train_step")["queue"].name == "train"
    assert router.route({}, "workers.rewards.score_experiences")["queue"].name == "reward"
    assert router.route({}, "apps.buffer.tasks.lease_reap_task")["queue"].name == "default"


def _compose_env(service: str) -> dict[str, str]:
    """The service's environment with ${VAR:-default} and ${VAR:?message} filled as compose would."""
    import re
    import secrets

    env = {}
    for name, value in _compose()["services"][service]["environment"].items():
        value = str(value)
        value = re.sub(r"\$\{SECRET_KEY:\?[^}]*\}", secrets.token_urlsafe(60), value)
        env[name] = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    return env


def test_the_web_service_passes_djangos_deployment_checks_with_the_production_profile() -> None:
    import os
    import subprocess

    # Only what the container would have: none of the test run's own variables.
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), **_compose_env("web")}
    # The compose hosts do not resolve here; the checks do not connect.
    env.update({"DATABASE_URL": "postgres://localhost:5432/test", "REDIS_URL": "redis://localhost:6379/0"})
    assert env["DEBUG"] == "0"
    checked = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "no issues" in checked.stdout
    shown = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE,"
         " s.SESSION_COOKIE_HTTPONLY, s.CSRF_COOKIE_HTTPONLY, s.SECURE_HSTS_SECONDS > 0, s.SECURE_PROXY_SSL_HEADER is not None,"
         " 'csp.middleware.CSPMiddleware' in s.MIDDLEWARE)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert shown.stdout.splitlines()[-1].split() == ["True"] * 8, shown.stdout + shown.stderr


def test_with_debug_on_the_profile_is_off_so_development_works_over_http() -> None:
    import os
    import subprocess

    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "DEBUG": "1"}
    shown = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from django.conf import settings as s; print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert shown.stdout.splitlines()[-1].split() == ["False", "False", "0"], shown.stdout + shown.stderr
