"""A tool-using agent, written against the official `openai` package, that trains a run's
model through the run's OpenAI-compatible endpoint.

Each episode takes one arithmetic task of the run (claimed over the environment API) and
asks the model with a `calc` tool on offer. When the model calls the tool, the agent
evaluates the expression (numbers and + - * / only, no eval) and sends the result back as a
tool message; the model then answers. The environment checks the final answer
(`<answer>N</answer>` against the task's reference): reward 1 for the right number, plus 0.1
for answering in tags at all. Every call names its session (`X-Rft-Session`) and task
(`X-Rft-Task`), so the platform records exact token ids; finishing the session with the
reward turns the episode into one multi-turn experience, and the `--group` episodes of a task
form one GRPO group. The run's trainer trains on them and publishes new versions, which the
next calls use.

    python examples/calculator_agent.py --url http://127.0.0.1:8000 --key rft_… --run 1 --rounds 20

On the demo model (`manage.py rft_demo_model`, a 256-token context) add `--compact-tool`: the
full tool definition alone takes ~350 of its tokens.

Needs `openai` and httpx (through `rftweb/client.py`).
"""

from __future__ import annotations

import ast
import json
import operator
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:
    # Run as a script (`python examples/calculator_agent.py`): Python puts examples/ on the
    # path, not the checkout's root where rftweb lives (the project is not pip-installed).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rftweb.client import ApiError, RftClient, environment_args, environment_parser  # noqa: E402

CALC_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression such as 12+7",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
# The same tool described by its name alone: the chat template's tool preamble plus this
# definition is ~175 tokens on the demo model's tokenizer (the full one ~350), which leaves
# room for a question and two turns in its 256-token context (`--compact-tool`).
CALC_TOOL_COMPACT: dict[str, Any] = {"type": "function", "function": {"name": "calc"}}
_ANSWER = re.compile(r"<answer>\s*(-?\d+(?:\.\d+)?)\s*</answer>")
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}


def calc(expression: str) -> str:
    """The tool: a number for + - * / over numbers, or an error message (never eval)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return float(_OPS[type(node.op)](value(node.left), value(node.right)))
        raise ValueError("only numbers and + - * /")

    try:
        if len(expression) > 200:
            raise ValueError("too long")
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if result == int(result) else f"{result:.6g}"


def reward_of(answer: str, reference: Any) -> tuple[float, dict[str, float]]:
    """The environment's check: 1 for the right number, 0.1 for answering in tags."""
    match = _ANSWER.search(answer or "")
    formatted = 0.1 if match else 0.0
    try:
        correct = 1.0 if match and float(match.group(1)) == float(str(reference)) else 0.0
    except ValueError:
        correct = 0.0
    return correct + formatted, {"correct": correct, "format": formatted}


@dataclass
class Episode:
    session: str
    task_id: int
    turns: int
    tool_calls: int
    answer: str
    reward: float
    parts: dict[str, float]


def _expression(arguments: str | None) -> str:
    """The expression a call asks for: its `expression` argument, else its first string one."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return ""
    if not isinstance(args, dict):
        return ""
    if "expression" in args:
        return str(args["expression"])
    return next((str(v) for v in args.values() if isinstance(v, (str, int, float))), "")


def episode_play(openai_client: Any, *, model: str, task: dict[str, Any], max_turns: int, max_tokens: int,
                 temperature: float, tool: dict[str, Any] | None = None, seed: int | None = None,
                 record: bool = True) -> Episode:
    """One conversation on one task, as any agent framework would have it. `record`: name the
    session and task so the platform keeps the calls for training (off for an evaluation);
    `seed`: the sampling seed of the first call (the next turns take the following ones)."""
    session = f"calc-{task['attempt_id']}-{uuid.uuid4().hex[:8]}"
    headers = {"X-Rft-Session": session, "X-Rft-Task": str(task["task_id"])} if record else {}
    messages: list[dict[str, Any]] = list(task.get("messages") or [{"role": "user", "content": task["prompt"]}])
    answer, turns, tool_calls = "", 0, 0
    while turns < max_turns:
        turns += 1
        extra: dict[str, Any] = {} if seed is None else {"seed": seed + turns - 1}
        reply = openai_client.chat.completions.create(
            model=model, messages=messages, tools=[tool or CALC_TOOL], tool_choice="auto", max_tokens=max_tokens,
            temperature=temperature, extra_headers=headers, **extra,
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            break
        messages.append({"role": "assistant", "content": message.content,
                         "tool_calls": [c.model_dump() for c in message.tool_calls]})
        for call in message.tool_calls:
            tool_calls += 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calc(_expression(call.function.arguments))})
    reward, parts = reward_of(answer, task.get("reference"))
    return Episode(session=session, task_id=int(task["task_id"]), turns=turns, tool_calls=tool_calls, answer=answer,
                   reward=reward, parts=parts)


def current_version(openai_client: Any, *, model: str) -> int:
    """The run's current model version, as its `models` listing says."""
    for entry in openai_client.models.list():
        if entry.id == model:
            return int(getattr(entry, "current_version", 0) or 0)
    raise LookupError(f"the endpoint does not list {model}")


def version_wait(openai_client: Any, *, model: str, newer_than: int, timeout: float,
                 poll: float = 0.5) -> int:
    """Wait until the run publishes a version newer than `newer_than`; the version, or the
    current one after `timeout` seconds (the trainer may have finished its steps)."""
    deadline = time.monotonic() + timeout
    while True:
        version = current_version(openai_client, model=model)
        if version > newer_than or time.monotonic() >= deadline:
            return version
        time.sleep(poll)


def agent_run(*, env: RftClient, openai_client: Any, run_id: int, rounds: int, tasks_per_round: int, group: int,
              max_turns: int = 3, max_tokens: int = 16, temperature: float = 1.0, tool: dict[str, Any] | None = None,
              seed: int | None = None, concurrency: int = 1, on_policy: bool = False, version_timeout: float = 600.0,
              log: Callable[[str], None] = print) -> list[list[Episode]]:
    """`rounds` rounds of `tasks_per_round` tasks, `group` episodes each, `concurrency` of them
    at a time; every episode's session is finished with its reward. Returns the episodes per
    round, in order. With `seed`, episode k samples with seed `seed + 1000·k` (its turns with
    the next ones): the same model versions sample the same tokens, in any order.

    `on_policy`: each round waits (up to `version_timeout` s) for the version trained on the
    round before. Without it the agent plays on with whatever version is current, and how many
    rounds a version serves depends on how fast the trainer keeps up: on a busy host several
    rounds of stale samples, a different run each time even with a seed. Waiting makes every
    round sample from the version trained on all the rounds before it (a train-mode run whose
    batch is one round, as the demo's): the same seed then plays the same episodes."""
    model = f"run-{run_id}"
    history: list[list[Episode]] = []
    played = 0
    version = current_version(openai_client, model=model) if on_policy else 0

    def play(task: dict[str, Any], k: int) -> Episode:
        episode = episode_play(openai_client, model=model, task=task, max_turns=max_turns, max_tokens=max_tokens,
                               temperature=temperature, tool=tool, seed=None if seed is None else seed + 1000 * k)
        env.finish_session(run_id, episode.session, reward=episode.reward, reward_parts=episode.parts)
        return episode

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for r in range(rounds):
            if on_policy and r > 0:
                version = version_wait(openai_client, model=model, newer_than=version, timeout=version_timeout)
            claim = env.claim_tasks(run_id, size=tasks_per_round, worker="calculator-agent")
            if not claim["tasks"]:
                log("no task left to claim")
                break
            jobs = [(task, played + i * group + j) for i, task in enumerate(claim["tasks"]) for j in range(group)]
            played += len(jobs)
            episodes = list(pool.map(lambda job: play(*job), jobs))
            env.finish_tasks(run_id, attempt_ids=[t["attempt_id"] for t in claim["tasks"]], worker="calculator-agent")
            history.append(episodes)
            mean = sum(e.reward for e in episodes) / len(episodes)
            calls = sum(e.tool_calls for e in episodes)
            log(f"round {r}: {len(episodes)} episodes, mean reward {mean:.3f}, {calls} tool calls"
                + (f", v{version}" if on_policy else ""))
    return history


def main(argv: Sequence[str] | None = None) -> int:
    parser = environment_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per round")
    parser.add_argument("--group", type=int, default=4, help="episodes per task (one GRPO group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    parser.add_argument("--concurrency", type=int, default=1, help="episodes played at a time")
    parser.add_argument("--on-policy", action="store_true",
                        help="before each round, wait for the version trained on the rounds before (train-mode runs)")
    parser.add_argument("--compact-tool", action="store_true",
                        help="describe the tool by its name only (fits models with a short context, e.g. the demo model)")
    args = environment_args(parser, argv)
    if min(args.rounds, args.tasks, args.group, args.max_turns, args.max_tokens, args.concurrency) < 1:
        parser.error("--rounds, --tasks, --group, --max-turns, --max-tokens and --concurrency must be at least 1")
    import openai

    client = openai.OpenAI(base_url=f"{args.url.rstrip('/')}/api/v1/runs/{args.run}/openai/v1", api_key=args.key,
                           timeout=args.timeout)
    with RftClient(args.url, args.key, timeout=args.timeout) as env:
        try:
            history = agent_run(env=env, openai_client=client, run_id=args.run, rounds=args.rounds,
                                tasks_per_round=args.tasks, group=args.group, max_turns=args.max_turns,
                                max_tokens=args.max_tokens, temperature=args.temperature,
                                tool=CALC_TOOL_COMPACT if args.compact_tool else CALC_TOOL, seed=args.seed,
                                concurrency=args.concurrency, on_policy=args.on_policy)
        except ApiError as exc:
            print(f"calculator_agent: the environment API said {exc}", file=sys.stderr)
            return 1
        except openai.APIError as exc:
            print(f"calculator_agent: the model endpoint said {exc}", file=sys.stderr)
            return 1
    episodes = [e for r in history for e in r]
    print(f"{len(episodes)} episodes, mean reward {sum(e.reward for e in episodes) / max(1, len(episodes)):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
