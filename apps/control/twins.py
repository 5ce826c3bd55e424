"""A run and its twin: the same run copied with people's feedback off, started beside it, so
that what people taught shows as the difference between the two (issues #46 item 4, #62
item 4). The demo makes one with its run (`rft_demo`), and starts it when the run starts.

A twin is a run without people by construction: the copy's feedback mode is `auto` and its
reward model off (everything else, the algorithm, seed, steps, tasksets and evaluation, as the
run has it), and `Run.twin_of` names the run it copies, so every door refuses labels on it by
the one check whether a run takes feedback (apps.runs.selectors.run_takes_feedback) and its
queue hands nothing out. Its audit entry `copied_as_twin` ({"of": the run's id}) says who
made it and when.

The run page and the summary of either run show, per preference share, each run's gain over
the train steps both runs evaluated, from version 0's evaluation (step 0) to the last step
both reached, and the people run's gain less the twin's with a 95% interval: the share's rise
that people, not the automatic reward, brought about. While either run goes on the
comparison is marked provisional."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import transaction

from apps.runs.models import AuditEntry, Metric, Run
from apps.runs.selectors import ConfigDifference, config_differences, runs_visible_to
from apps.runs.services import run_create, run_transition
from kernel.config import RunConfig, config_validate
from kernel.eval_series import PREFERENCE, PREFIX, Z95, metric_label, share_variance

TWIN_ACTION = "copied_as_twin"
SHARE_PREFIX = PREFIX + PREFERENCE
TASKS_METRIC = f"{PREFIX}tasks"
# A comparison's figures are final once neither run can evaluate again.
_ENDED = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)


def twin_config(config: Mapping[str, object]) -> RunConfig:
    """`config` without people: no feedback settings that fold labels, no reward model learning from
    them; the rest (algorithm, seed, steps, rewards, evaluation) as it is, for a fair comparison."""
    cfg = config_validate(data=config)
    return cfg.model_copy(update={"feedback": cfg.feedback.model_copy(update={"mode": "auto"}),
                                  "reward_model": cfg.reward_model.model_copy(update={"enabled": False})})


def run_twin_create(*, run: Run, actor: User | None = None, name: str = "") -> Run:
    """A draft copy of `run` with people's feedback off (twin_config), linked as its twin."""
    with transaction.atomic():
        twin = run_create(name=name or f"{run.name} (without people)", owner=run.owner, config=twin_config(run.config),
                          taskset=run.taskset)
        twin.twin_of = run
        twin.save(update_fields=["twin_of"])
        AuditEntry.objects.create(run=twin, actor=actor, action=TWIN_ACTION, detail={"of": run.pk})
    return twin


def run_twins_start(*, run: Run, actor: User | None = None) -> list[Run]:
    """Start `run`'s twins that are still drafts, beside it (a twin made before its run
    started starts with it, so both train over the same time on the same workers)."""
    started = []
    for twin in Run.objects.filter(twin_of=run, status=Run.Status.DRAFT):
        started.append(run_transition(run=twin, action="start", actor=actor))
    return started


def run_twin_pair(*, run: Run) -> tuple[Run, Run] | None:
    """(people run, twin) where `run` is either; its newest twin where it has several."""
    if run.twin_of_id is not None:
        people = Run.objects.filter(pk=run.twin_of_id).first()
        return (people, run) if people is not None else None
    newest = Run.objects.filter(twin_of=run).order_by("-created_at", "-pk").first()
    return (run, newest) if newest is not None else None


def difference_interval(*, shares: tuple[float, float, float, float], tasks: tuple[float, float, float, float],
                        z: float = Z95) -> tuple[float, float]:
    """The interval of (people end - people start) - (twin end - twin start), four shares of
    evaluations on `tasks` tasks each, taken as independent: the normal interval with each
    share's variance from one success and one failure added (Agresti and Caffo:
    kernel.eval_series.share_variance, which a single share's interval on the run page uses too)."""
    ps, pe, ts, te = shares
    difference = (pe - ps) - (te - ts)
    variance = sum(share_variance(share, n) for share, n in zip(shares, tasks))
    half = z * math.sqrt(variance)
    return difference - half, difference + half


@dataclass(frozen=True)
class ShareGain:
    """One preference share in both runs: each run's value at the first and the last step
    both evaluated, and the difference's 95% interval where the evaluations' task counts are known."""

    name: str
    label: str
    people_start: float
    people_end: float
    twin_start: float
    twin_end: float
    low: float | None = None
    high: float | None = None

    @property
    def people_gain(self) -> float:
        return self.people_end - self.people_start

    @property
    def twin_gain(self) -> float:
        return self.twin_end - self.twin_start

    @property
    def difference(self) -> float:
        """What people brought about: the people run's gain less the twin's."""
        return self.people_gain - self.twin_gain


@dataclass(frozen=True)
class TwinComparison:
    people: Run
    twin: Run
    shares: list[ShareGain]
    # The train steps both runs evaluated (0: version 0), the first and last of which the gains span.
    steps: list[int]
    # Whether either run goes on (its figures may still move).
    provisional: bool
    # The config keys the twin differs from its run in (its feedback turned off).
    differences: list[ConfigDifference]

    @property
    def going_on(self) -> list[Run]:
        """The runs of the pair that have not ended."""
        return [r for r in (self.people, self.twin) if r.status not in _ENDED]



Rows = Iterable[tuple[str, int, float]]


def _by_name(rows: Rows) -> dict[str, dict[int, float]]:
    points: dict[str, dict[int, float]] = {}
    for name, step, value in rows:
        points.setdefault(name, {})[step] = value
    return points


def common_steps(*, people: Rows, twin: Rows) -> list[int]:
    """The steps at which both runs evaluated some preference share."""
    ours = {step for name, step, _ in people if name.startswith(SHARE_PREFIX)}
    theirs = {step for name, step, _ in twin if name.startswith(SHARE_PREFIX)}
    return sorted(ours & theirs)


def share_gains(*, people: Rows, twin: Rows, people_tasks: Mapping[int, float] | None = None,
                twin_tasks: Mapping[int, float] | None = None) -> list[ShareGain]:
    """Each preference share both runs evaluated at version 0 (step 0) and at a later step
    both reached, from their metric rows (name, step, value); the gains run from step 0 to the
    last such step. `*_tasks`: each evaluation's task count by step (for the interval)."""
    people, twin = list(people), list(twin)
    steps = common_steps(people=people, twin=twin)
    if not steps or steps[0] != 0 or len(steps) < 2:
        return []
    end = steps[-1]
    ours = _by_name(r for r in people if r[0].startswith(SHARE_PREFIX))
    theirs = _by_name(r for r in twin if r[0].startswith(SHARE_PREFIX))
    gains = []
    for name in sorted(ours.keys() & theirs.keys()):
        a, b = ours[name], theirs[name]
        if not all(step in side for step in (0, end) for side in (a, b)):
            continue
        ours_n, theirs_n = people_tasks or {}, twin_tasks or {}
        counts = (ours_n.get(0, 0.0), ours_n.get(end, 0.0), theirs_n.get(0, 0.0), theirs_n.get(end, 0.0))
        low = high = None
        if all(counts):  # an evaluation without its task count gets no interval made up
            low, high = difference_interval(shares=(a[0], a[end], b[0], b[end]), tasks=counts)
        gains.append(ShareGain(name=name, label=metric_label(name), people_start=a[0], people_end=a[end],
                               twin_start=b[0], twin_end=b[end], low=low, high=high))
    return gains


def _share_rows(run: Run) -> list[tuple[str, int, float]]:
    return list(Metric.objects.filter(run=run, name__startswith=SHARE_PREFIX).values_list("name", "step", "value"))


def _tasks(run: Run) -> dict[int, float]:
    return dict(Metric.objects.filter(run=run, name=TASKS_METRIC).values_list("step", "value"))


def twin_comparison(*, run: Run, user: AbstractBaseUser | AnonymousUser) -> TwinComparison | None:
    """The comparison `run`'s page and summary show, where it has a twin or is one that
    `user` may see too (a run one may not see is not named)."""
    pair = run_twin_pair(run=run)
    if pair is None:
        return None
    people, twin = pair
    other = twin if run.pk == people.pk else people
    if not runs_visible_to(user=user).filter(pk=other.pk).exists():
        return None
    ours, theirs = _share_rows(people), _share_rows(twin)
    steps = common_steps(people=ours, twin=theirs)
    return TwinComparison(
        people=people, twin=twin, steps=steps,
        shares=share_gains(people=ours, twin=theirs, people_tasks=_tasks(people), twin_tasks=_tasks(twin)),
        provisional=people.status not in _ENDED or twin.status not in _ENDED,  # shown, marked (not held)
        differences=config_differences(people.config, twin.config),
    )
