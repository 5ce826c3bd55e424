"""A run and its twin: the same run copied with people's feedback off (the same config and
taskset, nobody rating it), started beside it, so that what people taught shows as the
difference between the two (issue #46 item 4). The demo's walk-through makes one
(bench/demo_teach).

The link is stored as the twin's audit entry `copied_as_twin` ({"of": the run's id}): who made
the copy and when, and which run it is the twin of. The run page and the summary of either run
show, per preference share both evaluated, each run's gain (its last evaluation less its first)
and the people run's gain less the twin's: the share's rise that people, not the automatic
reward, brought about."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db.models import Q

from apps.runs.models import AuditEntry, Metric, Run
from apps.runs.selectors import runs_visible_to
from apps.runs.services import run_create
from kernel.eval_series import PREFERENCE, PREFIX, metric_label

TWIN_ACTION = "copied_as_twin"
SHARE_PREFIX = PREFIX + PREFERENCE


def run_twin_create(*, run: Run, actor: User | None = None, name: str = "") -> Run:
    """A draft copy of `run` that nobody is to rate (its config and taskset), linked as its twin."""
    twin = run_create(name=name or f"{run.name} (without people)", owner=run.owner, config=run.config,
                      taskset=run.taskset)
    AuditEntry.objects.create(run=twin, actor=actor, action=TWIN_ACTION, detail={"of": run.pk})
    return twin


def run_twin_pair(*, run: Run) -> tuple[Run, Run] | None:
    """(people run, twin) where `run` is either; its newest twin where it has several. One
    query: the run page asks on every load, twin or not."""
    entries = AuditEntry.objects.filter(Q(run=run) | Q(detail__of=run.pk), action=TWIN_ACTION) \
        .select_related("run").order_by("-created_at")
    own = next((e for e in entries if e.run_id == run.pk), None)
    if own is not None:
        of = (own.detail or {}).get("of")
        people = Run.objects.filter(pk=of).first() if isinstance(of, int) else None
        return (people, run) if people is not None else None
    newest = next(iter(entries), None)
    return (run, newest.run) if newest is not None else None


@dataclass(frozen=True)
class ShareGain:
    """One preference share in both runs: each run's first and last evaluated value."""

    name: str
    label: str
    people_start: float
    people_end: float
    twin_start: float
    twin_end: float

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


def _ends(rows: Iterable[tuple[str, int, float]]) -> dict[str, tuple[float, float]]:
    """(first, last) value of each series by step, from (name, step, value) rows."""
    points: dict[str, list[tuple[int, float]]] = {}
    for name, step, value in rows:
        points.setdefault(name, []).append((step, value))
    return {name: (min(p)[1], max(p)[1]) for name, p in points.items()}


def share_gains(*, people: Iterable[tuple[str, int, float]], twin: Iterable[tuple[str, int, float]]) -> list[ShareGain]:
    """Each preference share both runs evaluated, from their metric rows (name, step, value)."""
    ours = _ends(r for r in people if r[0].startswith(SHARE_PREFIX))
    theirs = _ends(r for r in twin if r[0].startswith(SHARE_PREFIX))
    return [ShareGain(name=name, label=metric_label(name), people_start=ours[name][0], people_end=ours[name][1],
                      twin_start=theirs[name][0], twin_end=theirs[name][1])
            for name in sorted(ours.keys() & theirs.keys())]


def _share_rows(run: Run) -> list[tuple[str, int, float]]:
    return list(Metric.objects.filter(run=run, name__startswith=SHARE_PREFIX).values_list("name", "step", "value"))


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
    return TwinComparison(people=people, twin=twin, shares=share_gains(people=_share_rows(people),
                                                                        twin=_share_rows(twin)))
