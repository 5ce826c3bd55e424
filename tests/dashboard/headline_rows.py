"""A run people taught, with its twin, a blind evaluation with votes and stored answers: the
rows the run page's headline and versions panel are computed from (issue 64), and the
figures recomputed here from those rows, independently of apps/control/headline.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.contrib.auth.models import User

from apps.control.twins import run_twin_create
from apps.evaluation.models import Evaluation, Vote
from apps.evaluation.ports import answer_record, answers_needed, evaluation_open
from apps.evaluation.services import VersionRef, evaluation_create
from apps.runs.metrics import metric_record
from apps.runs.models import ModelVersion, Run
from tests.factories import add_member, make_run, make_taskset

Z = 1.959964
STEPS = (0, 2, 4, 6)
# Per version 0..3 (train steps 0, 2, 4, 6): the taught share, accuracy, tasks counted.
WORKING = (0.25, 0.40, 0.55, 0.50)
ACCURACY = (0.20, 0.30, 0.15, 0.10)
TASKS = (64, 64, 64, 60)
TWIN_WORKING = (0.25, 0.27, 0.30, 0.28)
# Model output that must reach the page as text.
HOSTILE = '<script>window.pwned = 1</script><b>bold</b> & "quoted"'

FEEDBACK = {"mode": "blend", "guidelines": "Show the working before the answer."}
EVAL = {"max_tasks": 64, "n": 2, "sampling": {"temperature": 1.0, "max_tokens": 32, "seed": 0},
        "preferences": ["working", "concise"]}


def interval(share: float, n: int) -> tuple[float, float]:
    """A share's 95% interval over n tasks, one success and one failure added."""
    p = (share * n + 1) / (n + 2)
    half = Z * math.sqrt(p * (1 - p) / (n + 2))
    return max(0.0, share - half), min(1.0, share + half)


def change(start: float, n0: int, end: float, n1: int) -> tuple[float, float, float, str]:
    """end - start, its 95% interval (both shares' variances added), and its words."""
    variance = 0.0
    for share, n in ((start, n0), (end, n1)):
        p = (share * n + 1) / (n + 2)
        variance += p * (1 - p) / (n + 2)
    half = Z * math.sqrt(variance)
    low, high = end - start - half, end - start + half
    return end - start, low, high, "rose" if low > 0 else "fell" if high < 0 else "no clear change"


def difference_interval(shares: tuple[float, ...], tasks: tuple[int, ...]) -> tuple[float, float, float]:
    """(people end - start) - (twin end - start), and its 95% interval."""
    ps, pe, ts, te = shares
    difference = (pe - ps) - (te - ts)
    variance = 0.0
    for share, n in zip(shares, tasks):
        p = (share * n + 1) / (n + 2)
        variance += p * (1 - p) / (n + 2)
    half = Z * math.sqrt(variance)
    return difference, difference - half, difference + half


def wilson(wins: float, n: int) -> tuple[float, float]:
    p = wins / n
    d = 1 + Z * Z / n
    centre = (p + Z * Z / (2 * n)) / d
    half = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / d
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Taught:
    run: Run
    twin: Run
    evaluation: Evaluation


def _evaluated(run: Run, working: tuple[float, ...], accuracy: tuple[float, ...] | None) -> None:
    for number, step in enumerate(STEPS):
        ModelVersion.objects.get_or_create(run=run, number=number,
                                           defaults={"checkpoint": f"/nowhere/v{number}", "train_step": step})
        values = {"eval/preference/working": working[number], "eval/preference/concise": 0.5,
                  "eval/tasks": float(TASKS[number]), "eval/version": float(number), "eval/reward_mean": 0.3}
        if accuracy is not None:
            values["eval/accuracy"] = accuracy[number]
        metric_record(run=run, step=step, values=values)
    Run.objects.filter(pk=run.pk).update(current_version=3, train_step=6)
    run.refresh_from_db()


def taught_run(owner: User, annotator: User, *, status: str = Run.Status.RUNNING) -> Taught:
    """The run people taught (guidelines, three preferences measured), its twin, both evaluated
    at versions 0-3, and a blind evaluation of v0 against v3 with 4 votes and stored answers."""
    evalset = make_taskset(8, owner=owner, name="held-out")
    run = make_run(owner=owner, taskset=make_taskset(owner=owner), name="taught",
                   feedback=FEEDBACK, eval_every=2, eval={**EVAL, "taskset": evalset.pk})
    add_member(run, annotator)
    twin = run_twin_create(run=run, actor=owner)
    _evaluated(run, WORKING, ACCURACY)
    _evaluated(twin, TWIN_WORKING, None)
    evaluation = evaluation_create(run=run, by=owner, versions=[VersionRef(number=0), VersionRef(number=3)],
                                   prompts=[f"What is {i} + {i}?" for i in range(4)], prompt_count=4, seed=11)
    for need in answers_needed(evaluation_id=evaluation.pk) or []:
        said = f"{HOSTILE} {need.text}" if need.version == 3 and need.text.startswith("What is 0") else f"{2 * int(need.text.split()[2])}"
        answer_record(need=need, text=f"v{need.version} says {said}")
    assert evaluation_open(evaluation_id=evaluation.pk)
    pairs = list(evaluation.items.filter(is_check=False).select_related("left", "right"))
    for item, choice in zip(pairs, ["left", "right", "right", "tie"]):
        Vote.objects.create(item=item, voter=annotator, choice=choice)
    Run.objects.filter(pk=run.pk).update(status=status)
    Run.objects.filter(pk=twin.pk).update(status=status)
    run.refresh_from_db()
    twin.refresh_from_db()
    return Taught(run=run, twin=twin, evaluation=evaluation)


def v3_wins(evaluation: Evaluation) -> tuple[float, int]:
    """v3's points over v0 from the vote rows: 1 a win, ½ a tie or both bad."""
    wins, n = 0.0, 0
    for vote in Vote.objects.filter(item__evaluation=evaluation, item__is_check=False).select_related("item__left", "item__right"):
        n += 1
        if vote.choice in ("tie", "both_bad"):
            wins += 0.5
        elif getattr(vote.item, vote.choice).number == 3:
            wins += 1.0
    return wins, n
