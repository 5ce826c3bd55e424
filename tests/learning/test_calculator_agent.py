"""The example agent (examples/calculator_agent.py) trains the demo model through the run's
OpenAI-compatible endpoint, and its reward goes up.

Everything is real: the agent speaks through the official `openai` package to a live server
(daphne), which generates on a Celery rollout worker; each episode's session is finished
over the environment API and becomes a multi-turn experience; the conductor and a Celery
trainer train GRPO on them (a train-mode run: the agent is the explorer) and publish
versions, which the agent's next calls use. The agent plays on-policy: each round waits for
the version trained on the rounds before it, so with its fixed seed a rerun plays the same
episodes whatever the host's load (playing on with stale versions while a loaded trainer
lagged made the runs differ, and 1 run in 3 lost the format at this learning rate).

The demo model (256-token context, never shown a tool) is offered the tool by name only
(`CALC_TOOL_COMPACT`: the prompt is ~175 tokens). The unfamiliar tool preamble costs it half
its `<answer>` format, which GRPO wins back. The gain is measured the way the agent sees it:
the same held-out problems (never in the taskset), greedy, through the endpoint at v0 and at
the last version, paired per problem.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from apps.control.demo import demo_taskset_import
from apps.runs.models import Run
from apps.runs.services import run_transition
from bench.common import run_wait_ended
from tests.envapi.conftest import make_key
from tests.factories import make_run
from tests.servers import start_server, stop

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROUNDS = 15
TASKS = 8
GROUP = 4
EVAL_PROBLEMS = 64
SEED = 1234

AGENT_CONFIG: dict[str, Any] = {
    "algorithm": "grpo",
    "mode": "train",
    "engine": "transformers",
    "sync_interval": 1,
    "repeat_times": GROUP,
    "train_batch_size": TASKS * GROUP,
    "total_steps": ROUNDS,
    "epochs": 1,
    "sampling": {"temperature": 1.0, "max_tokens": 16},
    "trainer": {"learning_rate": 3e-4, "loss_type": "grpo"},
    "seed": SEED,
}


def _evaluate(client: Any, *, model: str, problems: list[tuple[int, str, int]]) -> list[float]:
    """The agent's reward per held-out problem, greedy, nothing recorded."""
    from examples.calculator_agent import CALC_TOOL_COMPACT, episode_play
    from workers.demo_model import answer_of, problem_text

    rewards = []
    for i, problem in enumerate(problems):
        task = {"task_id": 0, "attempt_id": f"eval{i}", "prompt": problem_text(*problem), "reference": answer_of(*problem)}
        episode = episode_play(client, model=model, task=task, max_turns=2, max_tokens=16, temperature=0.0,
                               tool=CALC_TOOL_COMPACT, record=False)
        rewards.append(episode.reward)
    return rewards


def test_the_example_agent_raises_its_reward_on_the_demo_model(
    owner: Any, demo_model_dir: Path, loop_workers: dict[str, Path], tmp_path: Path
) -> None:
    from examples.calculator_agent import CALC_TOOL_COMPACT, agent_run
    from rftweb.client import RftClient
    from workers.demo_model import DemoSettings, _problems

    taskset = demo_taskset_import(owner=owner, model_dir=demo_model_dir)
    run = make_run(owner=owner, taskset=taskset, model=str(demo_model_dir), name="calc-agent", **AGENT_CONFIG)
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

        _, heldout, _ = _problems(DemoSettings())
        problems = heldout[:EVAL_PROBLEMS]
        before = _evaluate(client, model=f"run-{run.pk}@v0", problems=problems)
        after = _evaluate(client, model=f"run-{run.pk}@v{run.current_version}", problems=problems)
    finally:
        stop(server)

    # Every episode became an experience the trainer read, sampled by the version of its day.
    versions = sorted(set(run.experiences.values_list("model_version", flat=True)))
    assert run.experiences.count() == ROUNDS * TASKS * GROUP and versions == list(range(ROUNDS)), versions
    gains = [a - b for a, b in zip(after, before, strict=True)]
    ups, downs = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
    # Sign test: were the version no better than v0, a problem's reward would rise as often
    # as it falls; the chance of `ups` or more rises in ups + downs changes.
    p_value = sum(math.comb(ups + downs, k) for k in range(ups, ups + downs + 1)) / 2 ** (ups + downs)
    trend = [round(statistics.fmean(e.reward for e in r), 3) for r in history]
    print(f"\nagent reward on {len(problems)} held-out problems (greedy): v0 {statistics.fmean(before):.3f} -> "
          f"v{run.current_version} {statistics.fmean(after):.3f} ({ups} problems up, {downs} down, sign test "
          f"p = {p_value:.1e}); format {sum(b > 0 for b in before)} -> {sum(a > 0 for a in after)} of {len(problems)}; "
          f"training rounds' mean reward {trend}; {seconds:.0f} s")
    # Greedy, v0 scores the same every time: the change is the training's. A gain with a
    # sign-test p under 1e-3 is not what an untrained checkpoint's wobble gives.
    assert statistics.fmean(gains) > 0.02 and p_value < 1e-3, (ups, downs, p_value, trend)
