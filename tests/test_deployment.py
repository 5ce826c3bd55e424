"""docker-compose.yml names real commands and the queues the Celery app routes to."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
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
        # redis-server and postgres: the official images' own programs.
        assert program in {"redis-server", "postgres"} or (BIN / program).exists() or shutil.which(program), f"{name}: {program}"
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
    assert router.route({}, "workers.explore.explorer.explore_step")["queue"].name == "rollout"
    assert router.route({}, "workers.explore.evaluation.evaluate")["queue"].name == "rollout"
    assert router.route({}, "workers.trainer.task.train_step")["queue"].name == "train"
    assert router.route({}, "workers.reward.scoring.score_experiences")["queue"].name == "reward"
    assert router.route({}, "apps.buffer.tasks.lease_reap_task")["queue"].name == "default"
    for name in ("workers.reward.trainer.reward_model_train", "workers.reward.trainer.reward_model_score"):
        assert router.route({}, name)["queue"].name == "reward"


def test_no_task_names_its_queue_celery_6_would_ignore_it() -> None:
    """A task's own `queue=` is deprecated (no effect from Celery 6): task_routes routes
    every task. A fresh interpreter binds every task module's tasks with the warning an error."""
    import subprocess

    from tests.servers import child_env

    code = (
        "import warnings; from celery.exceptions import CDeprecationWarning;"
        "warnings.simplefilter('error', CDeprecationWarning);"
        "import django; django.setup();"
        "from rftweb.celery import app; import importlib;"
        "[importlib.import_module(m) for m in ('workers.explore.explorer', 'workers.explore.evaluation', 'workers.trainer',"
        " 'workers.reward.scoring', 'workers.reward.trainer', 'workers.explore.synthesize', 'apps.buffer.tasks', 'apps.control.tasks',"
        " 'apps.control.conductor_beat', 'apps.feedback.tasks', 'apps.feedback.tasks', 'apps.envapi.tasks')];"
        "app.finalize(); [t.name for t in app.tasks.values()]; print('bound', len(app.tasks))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=child_env(),
                         timeout=300)
    assert out.returncode == 0 and "bound" in out.stdout, out.stderr[-3000:]


# ----------------------------------------------------------------------------- issue 19: GPUs, storage, order

WORKER_HOST = ROOT / "docker-compose.worker-host.yml"
COMPOSE_ENV = {"SECRET_KEY": "x", "HEAD_HOST": "10.0.0.1", "STORAGE_PATH": "/mnt/rftweb"}


def _compose_cli() -> list[str] | None:
    """`docker compose` (v2 plugin) or Debian's `docker-compose`, whichever is installed."""
    import subprocess

    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def _resolved(path: Path, **env: str) -> dict:
    """The file as compose itself resolves it (anchors, variables, defaults)."""
    import os
    import subprocess

    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed (make test installs docker-compose)")
    result = subprocess.run([*cli, "-f", str(path), "config"], capture_output=True, text=True,
                            env={**os.environ, **COMPOSE_ENV, **env}, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_validates_both_deployment_files_and_refuses_a_missing_secret() -> None:
    import os
    import subprocess

    head = _resolved(ROOT / "docker-compose.yml")
    workers = _resolved(WORKER_HOST)
    assert {"postgres", "redis", "migrate", "web", "worker-rollout", "worker-train"} <= set(head["services"])
    assert set(workers["services"]) == {"worker-rollout", "worker-train", "learner-ranks"}
    # A host joins a learner gang spread over hosts only when asked: the ranks are a profile.
    assert workers["services"]["learner-ranks"]["profiles"] == ["learner"]
    cli = _compose_cli()
    assert cli is not None  # _resolved above needed it
    env = {k: v for k, v in os.environ.items() if k not in COMPOSE_ENV}
    result = subprocess.run([*cli, "-f", str(WORKER_HOST), "config"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode != 0 and "SECRET_KEY" in (result.stderr + result.stdout)


def test_gpu_workers_are_pinned_to_the_devices_they_are_given() -> None:
    for path in (ROOT / "docker-compose.yml", WORKER_HOST):
        services = _resolved(path, ROLLOUT_GPUS="2", TRAIN_GPUS="3")["services"]
        for name, gpu in (("worker-rollout", "2"), ("worker-train", "3")):
            devices = services[name]["deploy"]["resources"]["reservations"]["devices"]
            assert devices == [{"driver": "nvidia", "device_ids": [gpu], "capabilities": ["gpu"]}], (path.name, name)
    defaults = _resolved(ROOT / "docker-compose.yml")["services"]
    ids = [defaults[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in ("worker-rollout", "worker-train")]
    assert ids[0] != ids[1], "by default rollout and train would share a GPU"


def test_migrations_run_before_the_web_process_and_every_worker() -> None:
    services = _resolved(ROOT / "docker-compose.yml")["services"]
    for name, service in services.items():
        command = service.get("command") or []
        if name == "web" or command[:2] in (["celery", "-A"],):
            assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
    assert "migrate" not in services["migrate"].get("depends_on", {})


def test_every_app_service_on_every_host_sees_the_shared_storage_at_one_path() -> None:
    for path in (ROOT / "docker-compose.yml", WORKER_HOST):
        resolved = _resolved(path, STORAGE_PATH="/mnt/rftweb")
        for name, service in resolved["services"].items():
            if name in ("postgres", "redis"):
                continue
            assert service["environment"]["RFT_STORAGE_DIR"] == "/storage", (path.name, name)
            mounts = [v for v in service["volumes"] if (v.get("target") if isinstance(v, dict) else v.split(":")[1]) == "/storage"]
            assert mounts, (path.name, name)
        volume = resolved["volumes"]["storage"]
        assert volume["driver_opts"]["device"] == "/mnt/rftweb" and volume["driver_opts"]["o"] == "bind"
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


def test_the_web_service_runs_several_uvicorn_processes_within_postgres_connections() -> None:
    """WEB_PROCESSES uvicorn workers (default 4); every web process's pool plus one kept
    connection per worker process stays under 60% of Postgres's default 100 connections."""
    web = _compose()["services"]["web"]["command"]
    assert web[:2] == ["uvicorn", "rftweb.asgi:application"]
    assert web[web.index("--workers") + 1] == "${WEB_PROCESSES:-4}"
    worker_processes = 0
    for service in _compose()["services"].values():
        command = service.get("command") or []
        if command[:4] == ["celery", "-A", "rftweb", "worker"]:
            worker_processes += int(command[command.index("-c") + 1]) if "-c" in command else 1
    pool, beat = 10, 1  # RFT_DB_POOL_SIZE's default; beat's one connection
    assert 4 * pool + worker_processes + beat <= 60, (pool, worker_processes)


def test_the_head_postgres_drops_a_silent_hosts_session_within_seconds() -> None:
    """A cut worker host's trainer holds its run's lock in its Postgres session; the loop hands
    the step to another host only once the session is gone (tests/hosts/test_three_hosts.py
    cuts a link under these settings): well within the 30 s a fault may take, not the
    kernel's 2 h keepalive."""
    command = _compose()["services"]["postgres"]["command"]
    settings = dict(arg.split("=", 1) for arg in command[1:] if arg != "-c")
    assert command[0] == "postgres"
    silent = int(settings["tcp_keepalives_idle"]) + int(settings["tcp_keepalives_interval"]) * int(settings["tcp_keepalives_count"])
    assert silent <= 15 and int(settings["tcp_user_timeout"]) <= 15_000, settings
