"""Blind votes on a run's versions through the REST API (issue #63 item 6), shared by the
benches that end a people run beside its twin (bench/demo_teach, bench/live_steering).

The owner's key asks for one blind evaluation of version 0 against the people run's newest
version and the twin's newest (`blind_ask`); once the workers have written the answers, the
simulated voters take the pairs from `/next` in turn and vote through the API by a preference
(`blind_collect`): the higher-rated answer wins, equal ratings tie, both rated lowest "both
bad". A voter sees only the prompt and the two answer texts, sides drawn by the server: never
which version or run wrote which. The figures are read back through the API: per version, its
win rate over version 0 with its 95% interval, the votes it took and its verdict.

The direction check (`direction`): where a run's measured share of the preference moved by more
than `SHARE_MOVED`, its win rate over version 0 must lie on the same side of 0.5; a smaller move
is within the measurement's own noise and checks nothing. `votes_for_margin` is the votes a
±0.1 interval needs at the observed rate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A share move at or below this is within the evaluation's own noise: no direction to check.
SHARE_MOVED = 0.1


def api_call(url: str, key: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One request to the REST API with a voter's key; the JSON answer."""
    import urllib.request

    request = urllib.request.Request(
        f"{url}/api/v1{path}", data=None if body is None else json.dumps(body).encode(), method="GET" if body is None else "POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def blind_choice(prefer: Callable[[str, str], int], prompt: str, a: str, b: str) -> str:
    """A voter's choice by the preference: the higher-rated answer, equal ratings a tie, both
    rated lowest both bad. The voter sees only the prompt and the two texts."""
    left, right = prefer(prompt, a), prefer(prompt, b)
    if left == right:
        return "both_bad" if left == 1 else "tie"
    return "a" if left > right else "b"


def blind_ask(*, url: str, owner_key: str, people: int, twin: int, newest: dict[int, int], voters: list[str],
              prompt_count: int, prompts: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """Ask, through the REST API with the owner's key, for one blind evaluation of version 0
    against the people run's and the twin's newest versions, each pair voted once; `prompts`
    (none: drawn from the run's evaluation taskset). Returns the evaluation as the API gives it."""
    body: dict[str, Any] = {
        "versions": [{"version": 0}, {"version": newest[people]}, {"version": newest[twin], "run": twin}],
        "prompt_count": prompt_count, "votes_per_pair": 1, "voters": sorted(voters), "seed": seed}
    if prompts is not None:
        body["prompts"] = prompts
    evaluation: dict[str, Any] = api_call(url, owner_key, f"/runs/{people}/evaluations", body)
    return evaluation


def blind_collect(*, url: str, owner_key: str, keys: list[str], people: int, evaluation: dict[str, Any],
                  newest: dict[int, int], prefer: Callable[[str, str], int], seconds: float,
                  log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Wait (bounded by `seconds`) for the evaluation's answers; let the voters (`keys`) take
    a pair each in turn and vote by `prefer` until nothing is left for any of them; return its
    figures with the votes cast and the versions voted on (None when the answers were not
    ready in time)."""
    path = f"/runs/{people}/evaluations/{evaluation['id']}"
    until = time.monotonic() + seconds
    while evaluation["status"] == "generating" and time.monotonic() < until:
        time.sleep(2)
        evaluation = next(e for e in api_call(url, owner_key, f"/runs/{people}/evaluations")
                          if e["id"] == evaluation["id"])
    if evaluation["status"] != "open":
        log(f"blind votes: evaluation {evaluation['id']} still {evaluation['status']} after {seconds:.0f} s "
            f"{evaluation['error']}".rstrip())
        return None
    cast = 0
    waiting = list(keys)
    # In turn, as several people at the vote page at once: each voter's share of the pairs,
    # not the first voter's all of them.
    while waiting:
        for key in list(waiting):
            item = api_call(url, key, f"{path}/next")["item"]
            if item is None:
                waiting.remove(key)
                continue
            api_call(url, key, f"{path}/votes", {"token": item["token"],
                                                 "choice": blind_choice(prefer, item["prompt"], item["a"], item["b"])})
            cast += 1
    figures: dict[str, Any] = api_call(url, owner_key, f"{path}/figures")
    figures["cast"] = cast
    figures["voters"] = len(keys)
    figures["newest"] = newest
    return figures


def direction(rate: float, move: float) -> bool | None:
    """Whether the win rate over version 0 lies on the side of 0.5 the share moved to (None:
    the share moved `SHARE_MOVED` or less, nothing to check). The point estimate's direction:
    the verdict beside it says whether the interval can tell it from even."""
    if abs(move) <= SHARE_MOVED:
        return None
    return rate != 0.5 and (rate > 0.5) == (move > 0)


@dataclass(frozen=True)
class Arm:
    """One run of the evaluation: its name in the bench's lines, and its measured share of the
    preference (`start`, `end`: printed when known; `move`: the end less the start)."""

    run: int
    name: str
    move: float
    start: float | None = None
    end: float | None = None


@dataclass(frozen=True)
class ArmVotes:
    """One run's newest version against version 0: the win rate and its direction check."""

    arm: Arm
    rate: float
    votes: int
    votes_for_margin: int
    agree: bool | None


def blind_arms(figures: dict[str, Any], arms: list[Arm]) -> list[tuple[dict[str, Any], ArmVotes]]:
    """Each win rate of `figures` (against version 0) with the arm it belongs to and its check:
    the people run's newest is named `v<n>`, another run's `run <id> v<n>`."""
    people = arms[0].run
    names = {(f"v{figures['newest'][a.run]}" if a.run == people else f"run {a.run} v{figures['newest'][a.run]}"): a
             for a in arms}
    out = []
    for rate in figures["win_rates"]:
        arm = names[rate["version"]]
        out.append((rate, ArmVotes(arm=arm, rate=rate["rate"], votes=rate["votes"],
                                   votes_for_margin=rate["votes_for_margin"], agree=direction(rate["rate"], arm.move))))
    return out


def blind_lines(figures: dict[str, Any], arms: list[Arm], *, prefix: str = "") -> tuple[list[str], list[ArmVotes]]:
    """The evaluation's line, then per run against version 0: the win rate with its interval
    and votes, the verdict, the run's share move and the direction check, the votes a ±0.1
    interval needs. Returns the lines and each arm's figures."""
    both_bad = figures["both_bad_share"]
    lines = [f"{prefix}blind votes: evaluation {figures['evaluation']}, {figures['cast']} votes cast by "
             f"{figures['voters']} voters ({figures['checks']} planted checks), both-bad share "
             f"{'-' if both_bad is None else format(both_bad, '.3f')}"]
    checked = []
    for rate, votes in blind_arms(figures, arms):
        arm = votes.arm
        shares = "share" if arm.start is None or arm.end is None else f"share {arm.start:.3f} -> {arm.end:.3f},"
        if votes.agree is None:
            check = f"{shares} moved {arm.move:+.3f} (<= {SHARE_MOVED}): no check"
        elif rate["rate"] == 0.5:
            check = f"{shares} moved {arm.move:+.3f}: DISAGREE (win rate even)"
        else:
            check = f"{shares} moved {arm.move:+.3f}: " + ("agree" if votes.agree else "DISAGREE")
        lines.append(f"{prefix}blind {arm.name} {rate['version']} vs v0: win rate {rate['rate']:.3f} "
                     f"[{rate['interval']['low']:.3f}, {rate['interval']['high']:.3f}] over {rate['votes']} votes "
                     f"({rate['verdict']}); {check}; ±0.1 needs {rate['votes_for_margin']} votes")
        checked.append(votes)
    return lines, checked
