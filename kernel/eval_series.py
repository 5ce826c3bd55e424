"""The held-out evaluation's series by what they measure (workers/explore/evaluation.py records them):
their names as people read them, which of them may choose a run's best version
(`eval.best_by`), and which are bookkeeping rather than measurements.

No Django: the config (pydantic) reads `best_by_check`, the pages and the API the labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PREFIX = "eval/"
PREFERENCE = "preference/"

# Series a best version can be chosen by, beside each preference's share.
ACCURACY, REWARD_MEAN, FORMAT_SHARE = "accuracy", "reward_mean", "format_share"
BEST_BY_FIXED = (ACCURACY, REWARD_MEAN, FORMAT_SHARE)

# Names people read, by metric name. `eval/positive_share` holds what `eval/accuracy` meant
# before the domain's verifier did (migration runs/0009 renamed the stored rows).
LABELS: dict[str, str] = {
    f"{PREFIX}{ACCURACY}": "accuracy (the domain's verifier)",
    f"{PREFIX}{FORMAT_SHARE}": "format share (well-formed answers)",
    f"{PREFIX}{REWARD_MEAN}": "evaluation reward mean",
    f"{PREFIX}reward_std": "evaluation reward std",
    f"{PREFIX}positive_share": "share scoring above 0 (older evaluations)",
    f"{PREFIX}response_length": "evaluation response length",
}
# Bookkeeping of each evaluation: not a measurement of the answers.
BOOKKEEPING = frozenset({f"{PREFIX}version", f"{PREFIX}tasks", f"{PREFIX}seconds", f"{PREFIX}best_version"})


def metric_label(name: str) -> str:
    """What a metric measures, in words (its name where it has no words of its own)."""
    if name.startswith(PREFIX + PREFERENCE):
        return f"preference share: {name.removeprefix(PREFIX + PREFERENCE)}"
    return LABELS.get(name, name)


def is_eval_measure(name: str) -> bool:
    """An evaluation series that measures the answers (the summary shows each)."""
    return name.startswith(PREFIX) and name not in BOOKKEEPING and name != f"{PREFIX}response_length"


def best_by_choices(preferences: Sequence[str]) -> list[str]:
    """What `eval.best_by` may name for a run measuring `preferences`."""
    return [*BEST_BY_FIXED, *(f"{PREFERENCE}{name}" for name in preferences)]


def best_by_check(best_by: str | None, preferences: Sequence[str]) -> None:
    """ValueError naming the choices when `best_by` is none of them."""
    choices = best_by_choices(preferences)
    if best_by is not None and best_by not in choices:
        hint = "" if not best_by.startswith(PREFERENCE) else " (a preference must be one of eval.preferences)"
        raise ValueError(f"best_by must be one of {', '.join(choices)}{hint}")


def best_by_metric(best_by: str | None, *, has_accuracy: bool, taught: str | None = None) -> str:
    """The metric that chooses the best version: the config's; else the share the guidelines
    teach (`taught`: the run's first preference, where it has guidelines and measured it),
    so that the version offered is the one people taught; else accuracy where the evaluation
    has a verifier (an accuracy series), else the reward mean."""
    if best_by is not None:
        return f"{PREFIX}{best_by}"
    if taught is not None:
        return f"{PREFIX}{PREFERENCE}{taught}"
    return f"{PREFIX}{ACCURACY}" if has_accuracy else f"{PREFIX}{REWARD_MEAN}"


# Series that are a share of answers (between 0 and 1): each gets an interval on a page.
SHARES = frozenset({f"{PREFIX}{ACCURACY}", f"{PREFIX}{FORMAT_SHARE}", f"{PREFIX}positive_share"})
# The normal quantile of a two-sided 95% interval.
Z95 = 1.959964


def is_share(name: str) -> bool:
    """Whether an evaluation series is a share of answers (accuracy, format, a preference)."""
    return name in SHARES or name.startswith(PREFIX + PREFERENCE)


def share_variance(share: float, n: float) -> float:
    """A share's variance over `n` tasks with one success and one failure added (Agresti and
    Caffo), so that a share of 0 or 1 on few tasks still has a width. Tasks, not answers, are
    the count: a task's samples are alike, so counting them apart would narrow it falsely."""
    adjusted = (share * n + 1) / (n + 2)
    return adjusted * (1 - adjusted) / (n + 2)


def share_interval(share: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The 95% interval of one share over `n` tasks: the normal interval with
    `share_variance` (the twin comparison's, one share alone), kept within [0, 1]."""
    half = z * math.sqrt(share_variance(share, n))
    return max(0.0, share - half), min(1.0, share + half)


def change_interval(start: float, n_start: float, end: float, n_end: float, z: float = Z95) -> tuple[float, float]:
    """The 95% interval of a share's change from one evaluation to another (`end - start`),
    the two taken as independent, each with `share_variance` (the twin comparison's rule for
    two shares rather than four)."""
    half = z * math.sqrt(share_variance(start, n_start) + share_variance(end, n_end))
    return end - start - half, end - start + half


def change_words(interval: tuple[float, float]) -> str:
    """What a change's interval says: "rose", "fell", or "no clear change" (it holds 0)."""
    low, high = interval
    return "rose" if low > 0 else "fell" if high < 0 else "no clear change"


def sampling_words(*, samples: int, temperature: float) -> str:
    """How an evaluation answered each task, in words: "2 samples a task, sampled at
    temperature 1" or "one answer a task, greedy"."""
    how = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}"
    return f"{'one answer' if samples == 1 else f'{samples} samples'} a task, {how}"


def basis_words(*, tasks: int, samples: int, temperature: float) -> str:
    """What an evaluation's figures count, in words: "64 tasks × 2 samples, sampled at
    temperature 1" or "200 tasks, greedy"."""
    per = "" if samples == 1 else f" × {samples} samples"
    how = "greedy" if temperature == 0 else f"sampled at temperature {temperature:g}"
    return f"{tasks} task{'s' if tasks != 1 else ''}{per}, {how}"
