"""A chat task that runs long keeps its worker alive in the run's liveness checks: the
worker's heartbeat row keeps being written while the task generates, and lists the task
with its run (apps/runs/heartbeat.py), so `workers_health` says busy, never stale."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User

from apps.runs.heartbeat import workers_health
from apps.runs.models import WorkerHeartbeat
from tests.factories import make_run
from tests.servers import celery_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEAT = 0.5  # RFT_HEARTBEAT_SECONDS in the worker; dead after 5 beats (2.5 s)


def test_a_long_chat_task_keeps_its_worker_busy_not_stale(owner: User, tmp_path: Any, settings: Any) -> None:
    from workers.models.tiny import tiny_model_save
    from rftweb.celery import app

    settings.RFT_HEARTBEAT_SECONDS = BEAT
    settings.RFT_WORKER_DEAD_SECONDS = 5 * BEAT
    model = tiny_model_save(tmp_path / "model", hidden_size=64, layers=2, heads=2, max_positions=1024, vocab_size=384)
    run = make_run(owner=owner, model=str(model), engine="transformers", name="long chat",
                   sampling={"temperature": 1.0, "max_tokens": 16})
    with celery_worker("rollout", name="chat-beat", log=tmp_path / "worker.log", includes=("workers.explore.explorer",),
                       RFT_HEARTBEAT_SECONDS=str(BEAT), RFT_WORKER_DEAD_SECONDS=str(5 * BEAT)):
        warm = {"endpoint": "completion", "prompts": ["What is"], "n": 1, "sampling": {"max_tokens": 2}}
        app.send_task("workers.explore.chat.chat", args=[run.pk, warm], queue="rollout").get(timeout=300)
        # Long enough for many beats: 24 samples of 900 tokens (a random model rarely ends early);
        # 8 of 700 took 2.4 s on a quiet host once the engine read a batch with tensor ops.
        request = {"endpoint": "completion", "prompts": ["What is"], "n": 24,
                   "sampling": {"max_tokens": 900, "temperature": 1.0, "seed": 0}}
        result = app.send_task("workers.explore.chat.chat", args=[run.pk, request], queue="rollout")
        seen: list[tuple[float, str, list[Any]]] = []
        while not result.ready():
            for row in workers_health():
                beat = row["beat"]
                if beat.hostname.startswith("chat-beat-"):
                    seen.append((time.monotonic(), row["state"], [(t.get("name"), t.get("run_id")) for t in beat.active]))
            time.sleep(0.2)
        answer = result.get(timeout=10)
    assert "error" not in answer
    during = [s for s in seen if ("workers.explore.chat.chat", run.pk) in s[2]]
    assert during, f"the chat task never showed in its worker's heartbeat: {seen[-3:]}"
    # The task ran for longer than the worker would take to look dead without beats ...
    assert during[-1][0] - during[0][0] > 5 * BEAT, "the task was too short to tell"
    # ... and every look while it ran saw the worker busy with it, never stale.
    assert {state for _, state, _ in during} == {"busy"}, [state for _, state, _ in during]
    assert WorkerHeartbeat.objects.filter(hostname__startswith="chat-beat-").count() == 1
