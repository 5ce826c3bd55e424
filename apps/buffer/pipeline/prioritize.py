"""prioritize: replay priorities of experiences and curriculum priorities of tasks.

Claims take experiences by `priority` (highest first) and task attempts likewise, so these
operators steer what is trained and explored next. Priorities that change with time (age,
use count, flags that arrive later) are recomputed by `experience_priorities_refresh`
from the same operators configured in `on_write`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import Field, model_validator

from apps.buffer.pipeline.core import Ctx, is_number, metadata_set, row_get
from kernel.operators import Row
from kernel.operators import Params, register


class RewardVariancePriorityParams(Params):
    weight: float = Field(1.0, ge=0.0)
    offset: float = 0.0


@register("priority_reward_variance", stages=("write",), params=RewardVariancePriorityParams)
def priority_reward_variance(rows: list[Row], ctx: Ctx, params: RewardVariancePriorityParams) -> None:
    """Priority = offset + weight × the reward std of the row's group (informative groups first)."""
    by_group: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        group = row_get(row, "group_id")
        if group not in (None, ""):
            by_group[str(group)].append(row)
    for members in by_group.values():
        given = [r.get("reward") for r in members]
        if not all(is_number(x) for x in given):
            continue
        rewards = [float(x) for x in given if x is not None]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
        priority = params.offset + params.weight * std
        for row in members:
            row["priority"] = priority
            metadata_set(row, base_priority=priority)
        ctx.count("prioritized", len(members))


class ReplayPriorityParams(Params):
    # Priority = base × decay^uses × ½^(age / half_life) + flag_boost if a person flagged it.
    base: float = Field(1.0, ge=0.0, description="base priority of a row that has none")
    decay: float = Field(0.5, gt=0.0, le=1.0)
    half_life_seconds: float | None = Field(None, gt=0.0)
    flag_boost: float = Field(0.0, ge=0.0)


def replay_priority(
    *, base: float, use_count: int, age_seconds: float, flagged: bool, params: ReplayPriorityParams
) -> float:
    priority = base * params.decay ** use_count
    if params.half_life_seconds:
        priority *= 0.5 ** (max(0.0, age_seconds) / params.half_life_seconds)
    return priority + (params.flag_boost if flagged else 0.0)


def row_base_priority(row: Row, params: ReplayPriorityParams) -> float:
    meta = row.get("metadata")
    if isinstance(meta, dict) and is_number(meta.get("base_priority")):
        return float(meta["base_priority"])
    return params.base


@register("priority_replay", stages=("write",), params=ReplayPriorityParams)
def priority_replay(rows: list[Row], ctx: Ctx, params: ReplayPriorityParams) -> None:
    """Replay priority: decays with use count and age, boosted for human-flagged rows."""
    for row in rows:
        if "priority" in row and is_number(row["priority"]) and not _has_base(row):
            # A priority the writer chose (or an earlier operator set) is the base.
            base = float(row["priority"])
        else:
            base = row_base_priority(row, params)
        row["priority"] = replay_priority(base=base, use_count=0, age_seconds=0.0, flagged=False, params=params)
        metadata_set(row, base_priority=base)


def _has_base(row: Row) -> bool:
    meta = row.get("metadata")
    return isinstance(meta, dict) and "base_priority" in meta


# --- curriculum ------------------------------------------------------------------------


class CurriculumParams(Params):
    # An experience with reward >= pass_reward is a pass; a task's pass rate is its
    # experiences' share of passes in this run.
    pass_reward: float = 1.0
    # The difficulty band to target: tasks the model passes sometimes but not always.
    band_low: float = Field(0.2, ge=0.0, le=1.0)
    band_high: float = Field(0.8, ge=0.0, le=1.0)
    unseen_priority: float = 2.0
    # On import: a numeric metadata key giving a task's difficulty (higher = harder), or
    # its known pass rate under "pass_rate".
    difficulty_key: str = "difficulty"

    @model_validator(mode="after")
    def _band(self) -> CurriculumParams:
        if self.band_low > self.band_high:
            raise ValueError(f"band_low ({self.band_low}) is above band_high ({self.band_high})")
        return self


def curriculum_priority(pass_rate: float | None, params: CurriculumParams) -> float:
    """Task priority from its pass rate: in the band first (easier first), then unseen,
    then too hard (easier first), then mastered ones last."""
    if pass_rate is None:
        return params.unseen_priority
    if params.band_low <= pass_rate <= params.band_high:
        return 3.0 + pass_rate
    if pass_rate < params.band_low:
        return 1.0 + (pass_rate / params.band_low if params.band_low else 0.0)
    return 1.0 - pass_rate


@register("curriculum", stages=("write", "import"), params=CurriculumParams)
def curriculum(rows: list[Row], ctx: Ctx, params: CurriculumParams) -> None:
    """Curriculum task selection: queued task attempts ordered by pass rate toward a band."""
    if ctx.stage == "import":
        for row in rows:
            meta = row.get("metadata") or {}
            if is_number(meta.get("pass_rate")):
                priority = curriculum_priority(float(meta["pass_rate"]), params)
            elif is_number(meta.get(params.difficulty_key)):
                # Easy to hard: the easier the task, the higher its priority.
                priority = -float(meta[params.difficulty_key])
            else:
                continue
            metadata_set(row, priority=priority)
            ctx.count("prioritized")
        return
    task_ids = {row_get(row, "task_id", "task") for row in rows} - {None}
    if task_ids and ctx.run_id is not None:
        run_id, op = ctx.run_id, ctx.op

        def update() -> None:
            # After the write: the pass rates then include this batch's rewards.
            ctx.counts[f"{op}/tasks_prioritized"] += task_priorities_update(
                run_id=run_id, task_ids=task_ids, params=params
            )

        ctx.after.append(update)


def task_pass_rates(*, run_id: int, task_ids: Iterable[object] | None, pass_reward: float) -> dict[int, float]:
    from django.db.models import Count, Q

    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience

    qs = Experience.objects.filter(run_id=run_id, reward__isnull=False, is_expert=False, task_id__isnull=False)
    if task_ids is not None:
        qs = qs.filter(task_id__in=list(task_ids))
    rows = qs.values("task_id").annotate(n=Count("id"), passed=Count("id", filter=Q(reward__gte=pass_reward)))
    return {r["task_id"]: r["passed"] / r["n"] for r in rows if r["n"]}


def task_priorities_update(*, run_id: int, task_ids: Iterable[object] | None, params: CurriculumParams) -> int:
    """Set the priority of the run's queued attempts of these tasks (all when None)."""
    from django.db.models import Case, FloatField, Value, When

    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import TaskAttempt

    rates = task_pass_rates(run_id=run_id, task_ids=task_ids, pass_reward=params.pass_reward)
    queued = TaskAttempt.objects.filter(run_id=run_id, status="queued")
    changed = 0
    if task_ids is None:
        # A refresh of all: tasks without experiences yet get the unseen priority.
        changed += queued.exclude(task_id__in=list(rates)).update(priority=params.unseen_priority)
    if not rates:
        return changed
    priorities = {pk: curriculum_priority(rate, params) for pk, rate in rates.items()}
    return changed + queued.filter(task_id__in=list(priorities)).update(
        priority=Case(*[When(task_id=pk, then=Value(p)) for pk, p in priorities.items()], output_field=FloatField())
    )


def _age(now: datetime, created: datetime | None) -> float:
    return (now - created).total_seconds() if created else 0.0


def experience_priority_compute(
    *, row: dict[str, Any], flagged: bool, now: datetime, params: ReplayPriorityParams
) -> float:
    return replay_priority(
        base=row_base_priority(row, params), use_count=int(row.get("use_count") or 0),
        age_seconds=_age(now, row.get("created_at")), flagged=flagged, params=params,
    )
