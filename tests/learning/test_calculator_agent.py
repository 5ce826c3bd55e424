"""The example agent (examples/calculator_agent.py) trains the demo model through the
OpenAI-compatible endpoint: the official `openai` client against daphne, a real rollout
worker generating, every episode a recorded session finished with the environment's reward,
the conductor and a real trainer running GRPO on the assembled experiences in a train-only
run. The agent's reward over its last rounds beats its first rounds by more than noise.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.buffer.models import Experience
from apps.runs.demo import demo_taskset_import
from apps.runs.services import run_transition
from examples.calculator_agent import agent_run
from rftweb.client import RftClient
from tests.envapi.conftest import make_key
from tests.factories import make_run
from tests.servers import start_server, stop

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUNDS = 14
TASKS = 4
GROUP = 8

AGENT_CONFIG: dict[str, Any] = {
    "algorithm": "grpo",
    "mode": "train",
    "engine": "transformers",
    "repeat_times": GROUP,
    "train_batch_size": TASKS * GROUP,
    "total_steps": ROUNDS,
    "seed": 0,
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "trainer": {"learning_rate": 3e-4, "loss_type": "grpo"},
}


@pytest.fixture
def server(loop_workers: dict[str, Path], tmp_path: Path) -> Iterator[str]:
    proc, url = start_server(log=tmp_path / "daphne.log", RFT_ROLLOUT_TIMEOUT_SECONDS="300",
                             RFT_STORAGE_DIR=str(tmp_path / "storage"))
    try:
        yield url
    finally:
        stop(proc)


def test_the_calculator_agent_raises_its_reward_through_the_endpoint(
    owner: Any, demo_model_dir: Path, server: str, loop_workers: dict[str, Path]
) -> None:
    random.seed(0)
    taskset = demo_taskset_import(owner=owner, model_dir=demo_model_dir)
    run = make_run(owner=owner, taskset=taskset, model=str(demo_model_dir), **AGENT_CONFIG)
    run_transition(run=run, action="start", actor=owner)
    _, raw = make_key(run)
    client = openai.OpenAI(base_url=f"{server}/api/v1/runs/{run.pk}/openai/v1", api_key=raw, max_retries=0, timeout=300)
    with RftClient(server, raw, timeout=300) as env:
        history = agent_run(env=env, openai_client=client, run_id=run.pk, rounds=ROUNDS, tasks_per_round=TASKS,
                            group=GROUP, max_tokens=12, log=print)
    assert len(history) == ROUNDS
    run.refresh_from_db()
    assert Experience.objects.filter(run=run, source="env").count() == ROUNDS * TASKS * GROUP
    first = [e.parts["correct"] for r in history[:4] for e in r]
    last = [e.parts["correct"] for r in history[-4:] for e in r]
    p1, p2 = sum(first) / len(first), sum(last) / len(last)
    # Two-proportion z-test: the gain must be over three standard errors.
    pooled = (sum(first) + sum(last)) / (len(first) + len(last))
    se = math.sqrt(max(pooled * (1 - pooled), 1e-9) * (1 / len(first) + 1 / len(last)))
    print(f"\nagent accuracy: first 4 rounds {p1:.3f} -> last 4 rounds {p2:.3f} (z = {(p2 - p1) / se:.1f}); "
          f"trained to v{run.current_version}")
    assert run.current_version >= ROUNDS // 2, (run.current_version, run.status, run.error)
    assert p2 - p1 > 3 * se, f"no gain noise cannot explain: {p1:.3f} -> {p2:.3f}, se {se:.3f}"
