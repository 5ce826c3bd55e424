"""The example agent (examples/calculator_agent.py) trains the demo model through the run's
OpenAI-compatible endpoint: every episode becomes an experience, every round a version.

Everything is real: the agent speaks through the official `openai` package to a live server
(daphne), which generates on a Celery rollout worker; each episode's session is finished
over the environment API and becomes a multi-turn experience; the conductor and a Celery
trainer train GRPO on them (a train-mode run: the agent is the explorer) and publish
versions, which the agent's next calls use. The agent plays on-policy: each round waits for
the version trained on the rounds before it.

The demo model (256-token context, never shown a tool) is offered the tool by name only
(`CALC_TOOL_COMPACT`: the prompt is ~175 tokens). Whether its reward goes up is a learning
figure, measured by `bench/agent_learning` (15 rounds, 64 held-out problems, a sign test;
this test asserted it until 2026-11-26): here, a few rounds and the held-out evaluation
through the endpoint at v0 and at the last version on a few problems, as the bench does it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import pytest

from apps.control.demo import demo_taskset_import
from apps.runs.models import Run
from apps.runs.services import run_transition
from bench import agent_learning
from bench.common import run_wait_ended
from tests.envapi.conftest import make_key
from tests.factories import make_run
from tests.servers import start_server, stop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUNDS = 3
TASKS = 8
GROUP = 4
EVAL_PROBLEMS = 4
SEED = agent_learning.SEED


def test_the_example_agent_trains_the_demo_model_round_by_round(
    owner: Any, demo_model_dir: Path, loop_workers: dict[str, Path], tmp_path: Path
) -> None:
    from examples.calculator_agent import CALC_TOOL_COMPACT, agent_run
    from rftweb.client import RftClient
    from workers.models.demo import DemoSettings, problems_split

    taskset = demo_taskset_import(owner=owner, model_dir=demo_model_dir)
    run = make_run(owner=owner, taskset=taskset, model=str(demo_model_dir), name="calc-agent",
                   **agent_learning.agent_config(rounds=ROUNDS, tasks=TASKS, group=GROUP))
    _, raw = make_key(run)
    server, url = start_server(log=tmp_path / "server.log", RFT_ROLLOUT_TIMEOUT_SECONDS="300")
    try:
        client = openai.OpenAI(base_url=f"{url}/api/v1/runs/{run.pk}/openai/v1", api_key=raw, max_retries=0, timeout=300)
        started = time.monotonic()
        with RftClient(url, raw, timeout=300) as env:
            # The agent's claims queue the run's tasks: the train-mode run waits for the
            # experiences they will bring rather than finishing on an empty buffer.
            env.release_tasks(run.pk, attempt_ids=[t["attempt_id"] for t in env.claim_tasks(run.pk, size=1)["tasks"]])
            run_transition(run=run, action="start", actor=owner)
            history = agent_run(env=env, openai_client=client, run_id=run.pk, rounds=ROUNDS, tasks_per_round=TASKS,
                                group=GROUP, max_turns=2, max_tokens=16, temperature=1.0, tool=CALC_TOOL_COMPACT,
                                seed=SEED, concurrency=8, on_policy=True, version_timeout=240, log=print)
        run_wait_ended(run, seconds=240, poll=1.0)
        seconds = time.monotonic() - started
        logs = {name: path.read_text(errors="replace")[-1500:] for name, path in loop_workers.items()}
        assert run.status == Run.Status.FINISHED, (run.status, run.error, run.train_step, logs)
        assert len(history) == ROUNDS and all(len(r) == TASKS * GROUP for r in history)

        _, heldout, _ = problems_split(DemoSettings())
        problems = heldout[:EVAL_PROBLEMS]
        before = agent_learning.held_out_rewards(client, model=f"run-{run.pk}@v0", problems=problems)
        after = agent_learning.held_out_rewards(client, model=f"run-{run.pk}@v{run.current_version}", problems=problems)
    finally:
        stop(server)

    # Every episode became an experience the trainer read, sampled by the version of its day.
    versions = sorted(set(run.experiences.values_list("model_version", flat=True)))
    assert run.experiences.count() == ROUNDS * TASKS * GROUP and versions == list(range(ROUNDS)), versions
    # The bench's measure, on a few problems: each version answers through the endpoint (a
    # reward of 0, 0.1 or 1.1 per problem), and the line the bench prints reads them.
    assert len(before) == len(after) == EVAL_PROBLEMS and set(before + after) <= {0.0, 0.1, 1.1}, (before, after)
    line = agent_learning.gain_line(before, after, version=run.current_version)
    print(f"\n{line}; {seconds:.0f} s")
    assert f"v{ROUNDS} " in line and f"on {EVAL_PROBLEMS} held-out problems" in line
