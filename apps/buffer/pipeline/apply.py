"""Where the pipeline runs: on write, on import, on claim; and the priority refresh."""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from apps.buffer.flags import flagging_kinds
from apps.buffer.pipeline.core import Ctx, ModelRow, row_pk, steps_apply
from kernel.operators import Row
from kernel.config import PipelineStep, RunConfig, config_validate
from kernel.operators import stage_check
from kernel.operators import params_parse

if TYPE_CHECKING:
    from apps.buffer.models import Experience
    from apps.runs.models import Run

log = logging.getLogger(__name__)


@lru_cache(maxsize=256)
def _cfg_cached(config_json: str) -> RunConfig:
    return config_validate(data=json.loads(config_json))


def run_cfg_of(config: Mapping[str, object]) -> RunConfig:
    # Parsing a config costs more than a small write batch; configs repeat, so cache them.
    return _cfg_cached(json.dumps(config, sort_keys=True))


class PipelineSession:
    """One application of a stage's steps, possibly over several chunks of rows (an
    import); `finish()` once the rows are stored runs the deferred work and records what
    the operators did as run metrics."""

    def __init__(
        self, *, stage: str, steps: Sequence[PipelineStep], run: Run | None = None, taskset_id: int | None = None,
        run_cfg: RunConfig | None = None, step: int = 0,
    ) -> None:
        self.steps = list(steps)
        self.run = run
        self.step = step
        self.ctx = Ctx(
            stage=stage, run_id=getattr(run, "pk", None), taskset_id=taskset_id, now=timezone.now(),
            run_cfg=run_cfg if run_cfg is not None else (run.cfg if run is not None else None),
        )

    def apply(self, rows: list[Row]) -> list[Row]:
        if not self.steps:
            return rows
        return steps_apply(self.steps, rows, self.ctx)

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.ctx.counts)

    def finish(self, *, buffered: bool = False) -> None:
        for action in self.ctx.after:
            action()
        self.ctx.after.clear()
        if self.run is not None and self.ctx.counts:
            if buffered:
                _write_metrics.add(self.run, self.step, self.ctx.metric_values())
            else:
                # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
                from apps.runs.metrics import metric_record

                metric_record(run=self.run, step=self.step, values=self.ctx.metric_values())


class _MetricBuffer:
    """Write-stage counts summed per (run, step) and recorded at most every
    RFT_PIPELINE_METRICS_SECONDS (and when the step moves on, and at exit): recording
    (a Metric insert and a live event) per write batch would cost as much as the write.
    """

    def __init__(self) -> None:
        self.pending: dict[int, tuple[Run, int, Counter[str]]] = {}
        self.last_flush = time.monotonic()
        self.lock = threading.Lock()
        atexit.register(self.flush)

    def add(self, run: Run, step: int, values: dict[str, float]) -> None:
        from django.conf import settings

        with self.lock:
            held = self.pending.get(run.pk)
            if held is not None and held[1] != step:
                self._record(*held)
                held = None
            if held is None:
                held = self.pending[run.pk] = (run, step, Counter())
            held[2].update(values)
            due = time.monotonic() - self.last_flush >= settings.RFT_PIPELINE_METRICS_SECONDS
        if due:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = list(self.pending.values()), {}
            self.last_flush = time.monotonic()
        for held in pending:
            self._record(*held)

    @staticmethod
    def _record(run: Run, step: int, counts: Counter[str]) -> None:
        # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
        from apps.runs.metrics import metric_record

        try:
            metric_record(run=run, step=step, values=dict(counts))
        except Exception:  # metrics must never fail a write (nor the exit of a process)
            log.exception("pipeline metrics for run %s step %s were lost", run.pk, step)


_write_metrics = _MetricBuffer()


def pipeline_metrics_flush() -> None:
    """Record the write-stage pipeline counts held back so far."""
    _write_metrics.flush()


def _noop() -> None:
    return None


def pipeline_apply_on_write(*, experiences: Sequence[Mapping[str, object]]) -> tuple[Sequence[Mapping[str, object]], Callable[[], None]]:
    """Run each run's `pipeline.on_write` steps over a write batch, before validation.

    Returns the rows to write (copies, when any step ran; rows an operator removed carry
    status "filtered" and their filter_reason) and a callable to call once they are
    stored. Rows keep their positions, so a validation error still names the caller's row.
    """
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.runs.models import Run

    run_ids: set[int] = set()
    for row in experiences:
        pk = row_pk(row.get("run_id", row.get("run")))
        if isinstance(pk, int) and not isinstance(pk, bool):
            run_ids.add(pk)
    if not run_ids:
        return experiences, _noop
    runs = {
        run.pk: run
        for run in Run.objects.filter(pk__in=run_ids).only("id", "config", "explore_step")
        if (run.config or {}).get("pipeline", {}).get("on_write")
    }
    if not runs:
        return experiences, _noop

    rows: list[Mapping[str, object]] = list(experiences)
    copies: dict[int, Row] = {}
    by_run: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        pk = row_pk(row.get("run_id", row.get("run")))
        if pk in runs:
            rows[i] = copies[i] = dict(row)
            by_run.setdefault(pk, []).append(i)
    sessions = []
    for pk, positions in by_run.items():
        run = runs[pk]
        cfg = run_cfg_of(run.config)
        session = PipelineSession(stage="write", steps=cfg.pipeline.on_write, run=run, run_cfg=cfg, step=run.explore_step)
        batch = [copies[i] for i in positions]
        out = session.apply(batch)
        if len(out) != len(batch):
            raise RuntimeError("a write-stage operator added rows; only imports may synthesize")
        for row in batch:
            if row.get("filter_reason"):
                row["status"] = "filtered"
        sessions.append(session)

    def done() -> None:
        for session in sessions:
            session.finish(buffered=True)

    return rows, done


def pipeline_apply_on_claim(*, run: Run, experiences: list[Experience]) -> list[Experience]:
    """Run `pipeline.on_claim` over freshly selected (locked) experiences, inside the
    claim's transaction: rows an operator removes become status filtered with their
    reason; changes to the others are saved. Returns the experiences kept, in order."""
    steps = run.cfg.pipeline.on_claim
    if not steps or not experiences:
        return experiences
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience

    session = PipelineSession(stage="claim", steps=steps, run=run, step=run.train_step)
    rows = [ModelRow(e) for e in experiences]
    session.apply(list(rows))
    dropped = [r for r in rows if r.instance.filter_reason]
    for r in dropped:
        r.instance.status = Experience.Status.FILTERED
        r.instance.lease_owner, r.instance.lease_expires_at = "", None
        r.dirty.update({"status", "filter_reason", "lease_owner", "lease_expires_at"})
    changed = [r for r in rows if r.dirty]
    fields = sorted(set().union(*(r.dirty for r in changed))) if changed else []
    if changed:
        Experience.objects.bulk_update([r.instance for r in changed], fields, batch_size=500)
    transaction.on_commit(session.finish)
    return [r.instance for r in rows if not r.instance.filter_reason]


def pipeline_import_session(*, steps: Sequence[PipelineStep | Mapping[str, object]] | None, run: Run | None = None,
                            taskset_id: int | None = None) -> PipelineSession:
    """A session for a taskset import: the given steps, else the run's `on_import`."""

    if steps is None:
        steps = run.cfg.pipeline.on_import if run is not None else []
    parsed = [s if isinstance(s, PipelineStep) else PipelineStep.model_validate(s) for s in steps]
    for s in parsed:
        stage_check(s.name, "import")
    return PipelineSession(stage="import", steps=parsed, run=run, taskset_id=taskset_id,
                           step=getattr(run, "explore_step", 0))


def experience_priorities_refresh(*, run: Run, chunk: int = 2000) -> int:
    """Recompute the replay priority of the run's ready experiences (age, uses and human
    flags change over time) with its `priority_replay` step from `on_write`."""
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.models import Experience
    from apps.buffer.pipeline.prioritize import ReplayPriorityParams, experience_priority_compute
    step = next((s for s in run.cfg.pipeline.on_write if s.name == "priority_replay"), None)
    if step is None:
        return 0
    params = params_parse(step.name, dict(step.params))
    assert isinstance(params, ReplayPriorityParams)
    now = timezone.now()
    # Through the reverse relation of feedback.Feedback.experience: the feedback app sits
    # above the buffer (pyproject.toml's layers), so its model is not imported here.
    flagged = set(
        # A flag the run's owner rejected (feedback.Feedback.review) flags nothing.
        Experience.objects.filter(status=Experience.Status.READY, feedback__run=run, feedback__kind__in=flagging_kinds(),
                                  feedback__review__in=("pending", "accepted"))
        .values_list("pk", flat=True)
    )
    changed = 0
    last = 0
    while True:
        batch = list(
            Experience.objects.filter(run=run, status=Experience.Status.READY, pk__gt=last)
            .order_by("pk").only("id", "priority", "use_count", "created_at", "metadata")[:chunk]
        )
        if not batch:
            return changed
        last = batch[-1].pk
        update = []
        for e in batch:
            priority = experience_priority_compute(
                row={"metadata": e.metadata, "use_count": e.use_count, "created_at": e.created_at},
                flagged=e.pk in flagged, now=now, params=params,
            )
            if abs(priority - e.priority) > 1e-12:
                e.priority = priority
                update.append(e)
        Experience.objects.bulk_update(update, ["priority"], batch_size=1000)
        changed += len(update)


def task_priorities_refresh(*, run: Run) -> int:
    """Curriculum: set the priority of all the run's queued attempts from pass rates."""
    # Django-free: the kernel's registries import this module without Django (tests/test_layers.py).
    from apps.buffer.pipeline.prioritize import CurriculumParams, task_priorities_update

    step = next((s for s in run.cfg.pipeline.on_write if s.name == "curriculum"), None)
    if step is None:
        return 0
    params = params_parse(step.name, dict(step.params))
    assert isinstance(params, CurriculumParams)
    return task_priorities_update(run_id=run.pk, task_ids=None, params=params)
