"""A multi-turn number-guessing environment that trains a run's model through the API.

The environment thinks of a number; the model guesses (`<guess>7</guess>`); the environment
answers "higher" or "lower" until the model finds it or runs out of turns. The model plays
through the platform (`/rollouts`, the run's current version), and every episode goes back
as a trajectory: the chat messages, the token ids with an action mask (1 for the model's
tokens, 0 for the environment's) and logprobs, and the environment's reward with its parts.

    python -m examples.number_guess --url http://localhost:8000 --key rft_… --run 1 --add-tasks 8

Needs only httpx and `rftweb/client.py`. `--policy random` plays a local random (but
informed) guesser instead of the model: a baseline, and a way to try the plumbing without
a rollout worker.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:
    # Run as a script (`python examples/number_guess.py`): Python puts examples/ on the path,
    # not the checkout's root where rftweb lives (the project is not pip-installed).
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rftweb.client import ApiError, RftClient, TrajectoryResult, environment_args, environment_parser  # noqa: E402

GUESS = re.compile(r"<guess>\s*(-?\d+)\s*</guess>|(-?\d+)")


def rules(low: int, high: int, max_turns: int) -> str:
    return (f"I am thinking of a whole number from {low} to {high}. Guess it in at most {max_turns} turns. "
            "Answer with <guess>N</guess>; I will say higher or lower.")


def parse_guess(text: str) -> tuple[int | None, bool]:
    """The guessed number and whether it was in the asked-for format."""
    match = GUESS.search(text or "")
    if match is None:
        return None, False
    if match.group(1) is not None:
        return int(match.group(1)), True
    return int(match.group(2)), False


def reward_of(*, solved: bool, turns: int, max_turns: int, well_formed: int) -> tuple[float, dict[str, float]]:
    """Solving is most of it; solving fast and answering in format add the rest."""
    parts = {
        "solved": 1.0 if solved else 0.0,
        "speed": (max_turns - turns) / max(1, max_turns - 1) if solved else 0.0,
        "format": well_formed / max(1, turns),
    }
    return 0.7 * parts["solved"] + 0.2 * parts["speed"] + 0.1 * parts["format"], parts


@dataclass
class Episode:
    messages: list[dict[str, Any]]
    token_ids: list[int] = field(default_factory=list)
    prompt_length: int = 0
    logprobs: list[float] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    tokens_ok: bool = True
    model_version: int | None = None

    def add_turn(self, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float]) -> None:
        # The next prompt must extend what we have (previous prompt + completion + the
        # environment's reply); if a re-tokenisation breaks that, send messages only.
        if not self.tokens_ok:
            return
        if not self.token_ids:
            self.token_ids, self.prompt_length = list(prompt_ids), len(prompt_ids)
        elif prompt_ids[: len(self.token_ids)] == self.token_ids:
            env_part = prompt_ids[len(self.token_ids):]
            self.token_ids += env_part
            self.action_mask += [0] * len(env_part)
            self.logprobs += [0.0] * len(env_part)
        else:
            self.tokens_ok = False
            return
        if len(logprobs) != len(completion_ids):
            self.tokens_ok = False
            return
        self.token_ids += completion_ids
        self.action_mask += [1] * len(completion_ids)
        self.logprobs += list(logprobs)


class Player:
    def turn(self, episode: Episode, low: int, high: int) -> str:
        raise NotImplementedError


class PlatformPlayer(Player):
    """The run's model, through the API's rollouts endpoint."""

    def __init__(self, client: RftClient, run_id: int, *, max_tokens: int, temperature: float, timeout: float) -> None:
        self.client, self.run_id = client, run_id
        self.max_tokens, self.temperature, self.timeout = max_tokens, temperature, timeout

    def turn(self, episode: Episode, low: int, high: int) -> str:
        [result] = self.client.generate(
            self.run_id,
            [{"messages": episode.messages, "n": 1, "max_tokens": self.max_tokens, "temperature": self.temperature}],
            timeout_seconds=self.timeout,
        )
        completion = result["completions"][0]
        episode.add_turn(result["prompt_token_ids"], completion["token_ids"], completion["logprobs"])
        episode.model_version = result["model_version"]
        # Model output is untrusted bytes: the API refuses NUL characters in text.
        return completion["text"].replace("\x00", "\ufffd")


class RandomPlayer(Player):
    """Guesses uniformly inside what it knows so far: a baseline without a model."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def turn(self, episode: Episode, low: int, high: int) -> str:
        episode.tokens_ok = False
        return f"<guess>{self.rng.randint(low, high)}</guess>"


def play(player: Player, *, secret: int, low: int, high: int, max_turns: int) -> tuple[Episode, float, dict[str, float]]:
    episode = Episode(messages=[{"role": "system", "content": "You are playing a guessing game."},
                                {"role": "user", "content": rules(low, high, max_turns)}])
    lo, hi, well_formed, solved, turns = low, high, 0, False, 0
    for turns in range(1, max_turns + 1):
        text = player.turn(episode, lo, hi)
        episode.messages.append({"role": "assistant", "content": text})
        guess, in_format = parse_guess(text)
        well_formed += in_format
        if guess == secret:
            solved = True
            break
        if guess is None:
            reply = "I could not read a number. Answer with <guess>N</guess>."
        elif guess < secret:
            lo = max(lo, guess + 1)
            reply = "higher"
        else:
            hi = min(hi, guess - 1)
            reply = "lower"
        if turns < max_turns:
            episode.messages.append({"role": "user", "content": reply})
    reward, parts = reward_of(solved=solved, turns=turns, max_turns=max_turns, well_formed=well_formed)
    return episode, reward, parts


def trajectory(episode: Episode, *, key: str, group_id: str, task_id: int, reward: float, parts: dict[str, float]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "key": key, "group_id": group_id, "task_id": task_id, "messages": episode.messages,
        "reward": reward, "reward_parts": parts, "metadata": {"env": "number_guess"},
    }
    if episode.model_version is not None:
        item["model_version"] = episode.model_version
    if episode.tokens_ok and episode.token_ids:
        item.update(token_ids=episode.token_ids, prompt_length=episode.prompt_length,
                    logprobs=episode.logprobs, action_mask=episode.action_mask)
    return item


def game_tasks(n: int, *, low: int, high: int, max_turns: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"prompt": rules(low, high, max_turns), "reference": rng.randint(low, high), "domain": "game",
             "metadata": {"env": "number_guess", "low": low, "high": high, "max_turns": max_turns}} for _ in range(n)]


def run_env(client: RftClient, run_id: int, player: Player, *, episodes: int, batch: int = 4,
            worker: str = "number-guess", log: Any = print) -> list[TrajectoryResult]:
    """Claim game tasks, play each `repeat_times` times (one group), submit, finish. Returns
    the submitted trajectories' results."""
    group_size = int(client.run(run_id)["config"].get("repeat_times", 1))
    done: list[TrajectoryResult] = []
    while len(done) < episodes:
        claim = client.claim_tasks(run_id, size=batch, worker=worker)
        if not claim["tasks"]:
            break
        for task in claim["tasks"]:
            meta = task["metadata"]
            low, high, max_turns = int(meta.get("low", 1)), int(meta.get("high", 20)), int(meta.get("max_turns", 5))
            group = f"ng-{task['attempt_id']}"
            items = []
            for i in range(group_size):
                episode, reward, parts = play(player, secret=int(task["reference"]), low=low, high=high, max_turns=max_turns)
                items.append(trajectory(episode, key=f"{group}-{i}", group_id=group, task_id=task["task_id"],
                                        reward=reward, parts=parts))
            result = client.submit_trajectories(run_id, items)
            client.finish_tasks(run_id, attempt_ids=[task["attempt_id"]], worker=worker)
            mean = sum(i["reward"] for i in items) / len(items)
            log(f"task {task['task_id']}: {len(items)} episodes, mean reward {mean:.2f}")
            done.extend(result["results"])
            if len(done) >= episodes:
                break
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = environment_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--add-tasks", type=int, default=0, help="add this many games to the run's taskset first")
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=20)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--policy", choices=["platform", "random"], default="platform")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    args = environment_args(parser, argv)
    if args.low >= args.high or args.max_turns < 1:
        parser.error("need --low < --high and --max-turns >= 1")
    with RftClient(args.url, args.key) as client:
        try:
            if args.add_tasks:
                client.add_tasks(args.run, game_tasks(args.add_tasks, low=args.low, high=args.high,
                                                      max_turns=args.max_turns, seed=args.seed))
            player: Player = (RandomPlayer(args.seed) if args.policy == "random" else
                              PlatformPlayer(client, args.run, max_tokens=args.max_tokens,
                                             temperature=args.temperature, timeout=args.timeout))
            results = run_env(client, args.run, player, episodes=args.episodes)
        except ApiError as exc:
            print(f"number_guess: the API said {exc}", file=sys.stderr)
            for name, message in exc.errors.items():
                print(f"  {name}: {message}", file=sys.stderr)
            return 1
    print(f"submitted {len(results)} episodes ({sum(not r['duplicate'] for r in results)} new)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
