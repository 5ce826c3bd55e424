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
