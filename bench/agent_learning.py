"""The example agent (examples/calculator_agent.py) training the demo model through the run's
OpenAI-compatible endpoint: its reward on held-out problems before and after.

Everything is real, as in tests/learning/test_calculator_agent.py (which tests the path at
a few rounds; the gain is measured here, issue 50): the agent speaks through the official
`openai` package to daphne, which generates on a Celery rollout worker; each episode's session
is finished over the environment API and becomes a multi-turn experience; the conductor and a
Celery trainer train GRPO on them (a train-mode run: the agent is the explorer). The agent
plays on-policy (each round waits for the version trained on the rounds before), so with its
fixed seed a rerun plays the same episodes whatever the host's load.

The gain is measured the way the agent sees it: the same held-out problems (never in the
taskset), greedy, through the endpoint at v0 and at the last version, paired per problem, with
a sign test (were the version no better than v0, a problem's reward would rise as often as it
falls).

    python -m bench.agent_learning [--rounds 15] [--tasks 8] [--group 4] [--problems 64]

Measured (as the suite's test until 2026-11-26, 15 rounds, 64 problems): a mean gain above
0.02 with p < 1e-3 on every run since the on-policy change; the unfamiliar tool preamble costs
the demo model half its `<answer>` format, which GRPO wins back.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.common import BENCH_DB, DEMO_DIR, ROOT, bench_worker, free_port, health_wait, processes_stop, \
    run_wait_ended, setup_django

SEED = 1234


def agent_config(*, rounds: int, tasks: int, group: int) -> dict[str, Any]:
    """The run the agent trains: GRPO in train mode, the agent its only explorer."""
    return {
        "algorithm": "grpo", "mode": "train", "engine": "transformers", "sync_interval": 1,
        "repeat_times": group, "train_batch_size": tasks * group, "total_steps": rounds, "epochs": 1,
        "sampling": {"temperature": 1.0, "max_tokens": 16},
        "trainer": {"learning_rate": 3e-4, "loss_type": "grpo"}, "seed": SEED,
    }


def held_out_rewards(client: Any, *, model: str, problems: list[tuple[int, str, int]]) -> list[float]:
    """The agent's reward per held-out problem, greedy, nothing recorded."""
    from examples.calculator_agent import CALC_TOOL_COMPACT, episode_play
    from workers.models.demo import answer_of, problem_text

    rewards = []
    for i, problem in enumerate(problems):
        task = {"task_id": 0, "attempt_id": f"eval{i}", "prompt": problem_text(*problem), "reference": answer_of(*problem)}
        episode = episode_play(client, model=model, task=task, max_turns=2, max_tokens=16, temperature=0.0,
                               tool=CALC_TOOL_COMPACT, record=False)
        rewards.append(episode.reward)
    return rewards


def sign_test(before: list[float], after: list[float]) -> tuple[int, int, float]:
    """(problems up, problems down, the one-sided sign test's p of that many ups or more)."""
    gains = [a - b for a, b in zip(after, before, strict=True)]
    ups, downs = sum(g > 0 for g in gains), sum(g < 0 for g in gains)
    p_value = sum(math.comb(ups + downs, k) for k in range(ups, ups + downs + 1)) / 2 ** (ups + downs)
    return ups, downs, p_value


def gain_line(before: list[float], after: list[float], *, version: int) -> str:
    ups, downs, p_value = sign_test(before, after)
    return (f"agent reward on {len(before)} held-out problems (greedy): v0 {statistics.fmean(before):.3f} -> "
            f"v{version} {statistics.fmean(after):.3f} (gain {statistics.fmean(after) - statistics.fmean(before):+.3f}; "
            f"{ups} up, {downs} down, sign test p = {p_value:.1e}); format {sum(b > 0 for b in before)} -> "
            f"{sum(a > 0 for a in after)} of {len(before)}")


def _load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _train(args: argparse.Namespace, url: str) -> None:
    """The run, the agent's rounds through the endpoint, then both versions on held-out problems."""
    import openai

    from apps.control.demo import demo_taskset_import
    from apps.envapi.services import api_key_create
    from apps.runs.services import run_transition
    from examples.calculator_agent import CALC_TOOL_COMPACT, agent_run
    from rftweb.client import RftClient
    from tests.factories import make_run, make_user
    from workers.models.demo import DemoSettings, problems_split

    owner = make_user(f"bench-agent-{os.getpid()}")
    taskset = demo_taskset_import(owner=owner, model_dir=DEMO_DIR)
    run = make_run(owner=owner, taskset=taskset, model=str(DEMO_DIR), name="bench-agent",
                   **agent_config(rounds=args.rounds, tasks=args.tasks, group=args.group))
    _, raw = api_key_create(name="bench", runs=[run], actions=["read", "submit", "feedback"],
                            rate_limit_per_minute=1_000_000)
    client = openai.OpenAI(base_url=f"{url}/api/v1/runs/{run.pk}/openai/v1", api_key=raw, max_retries=0, timeout=300)
    started = time.monotonic()
    with RftClient(url, raw, timeout=300) as env:
        # The agent's claims queue the run's tasks: the train-mode run waits for their experiences.
        env.release_tasks(run.pk, attempt_ids=[t["attempt_id"] for t in env.claim_tasks(run.pk, size=1)["tasks"]])
        run_transition(run=run, action="start", actor=owner)
        history = agent_run(env=env, openai_client=client, run_id=run.pk, rounds=args.rounds, tasks_per_round=args.tasks,
                            group=args.group, max_turns=2, max_tokens=16, temperature=1.0, tool=CALC_TOOL_COMPACT,
                            seed=SEED, concurrency=8, on_policy=True, version_timeout=600, log=print)
    run_wait_ended(run, seconds=600, poll=1.0)
    print(f"run {run.status} at version {run.current_version} in {time.monotonic() - started:.0f} s; "
          f"training rounds' mean reward {[round(statistics.fmean(e.reward for e in r), 3) for r in history]}; {_load()}",
          flush=True)
    problems = problems_split(DemoSettings())[1][:args.problems]
    before = held_out_rewards(client, model=f"run-{run.pk}@v0", problems=problems)
    after = held_out_rewards(client, model=f"run-{run.pk}@v{run.current_version}", problems=problems)
    print(gain_line(before, after, version=run.current_version) + f"; {_load()}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per round")
    parser.add_argument("--group", type=int, default=4, help="episodes per task")
    parser.add_argument("--problems", type=int, default=64, help="held-out problems evaluated at v0 and the last version")
    args = parser.parse_args(argv)
    setup_django()
    from tests.servers import redis_flush

    redis_flush()
    logs = ROOT / ".cache" / "bench-agent-logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DATABASE_URL=BENCH_DB, DJANGO_SETTINGS_MODULE="rftweb.settings", PYTHONPATH=str(ROOT),
               RFT_ROLLOUT_TIMEOUT_SECONDS="300", RFT_STORAGE_DIR=str(logs / "storage"), RFT_CONDUCT_SECONDS="0.3")
    procs = [bench_worker("trainer", "train", ["workers.trainer"], env=env, logs=logs),
             bench_worker("explorer", "rollout", ["workers.explore.explorer"], env=env, logs=logs),
             bench_worker("conductor", "default", [], env=env, logs=logs, beat=True)]
    port = free_port()
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "rftweb.asgi:application"],
        cwd=ROOT, env=env, stdout=(logs / "daphne.log").open("wb"), stderr=subprocess.STDOUT))
    url = f"http://127.0.0.1:{port}"
    try:
        if not health_wait(url, seconds=600, alive=lambda: procs[-1].poll() is None):
            print(f"daphne did not answer: {(logs / 'daphne.log').read_text()[-2000:]}", file=sys.stderr)
            return 1
        _train(args, url)
    finally:
        processes_stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
