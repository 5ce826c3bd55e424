"""Celery's task decorator and signal hook-up, typed.

Celery ships no types: to mypy its names are `Any`, so a function under a bare
`@shared_task` loses its signature and a bare `@signal.connect` is an untyped decorator.
These wrappers call Celery's own and say what comes back: a task keeps its function's
signature, its `.delay` checks the arguments against it, and a result's `.get()` has the
function's return type. Nothing changes at run time: the objects are Celery's.

    @celery_task(name="workers.explore.evaluation.evaluate", ignore_result=True)
    def evaluate(run_id: int, version: int) -> EvalOutcome: ...

    @celery_bound_task(name="workers.trainer.task.train_step")  # bind=True: gets the task first
    def train_step(self: Task, run_id: int, step: int) -> StepOutcome: ...

    @on_signal(signals.worker_ready)
    def _warm(sender: object = None, **_: object) -> None: ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from celery import Task, shared_task

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
F = TypeVar("F", bound=Callable[..., object])


class TaskResult(Protocol[R_co]):
    """What `.delay`, `.apply_async` and `.apply` give back (an AsyncResult or EagerResult)."""

    @property
    def id(self) -> str: ...

    def get(self, timeout: float | None = None, propagate: bool = True) -> R_co: ...


class TypedTask(Protocol[P, R_co]):
    """A Celery task of a function taking P and returning R_co."""

    @property
    def name(self) -> str: ...

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[R_co]: ...

    def apply_async(self, args: Sequence[object] | None = None, kwargs: Mapping[str, object] | None = None,
                    **options: object) -> TaskResult[R_co]: ...

    def apply(self, args: Sequence[object] | None = None, kwargs: Mapping[str, object] | None = None,
              **options: object) -> TaskResult[R_co]: ...


class Signal(Protocol):
    """A Celery signal (celery.signals.*)."""

    def connect(self, receiver: Callable[..., object], **options: object) -> object: ...


def celery_task(**options: object) -> Callable[[Callable[P, R]], TypedTask[P, R]]:
    """`@shared_task(**options)`, typed."""
    decorate: Callable[[Callable[P, R]], TypedTask[P, R]] = shared_task(**options)
    return decorate


def celery_bound_task(**options: object) -> Callable[[Callable[Concatenate[Task, P], R]], TypedTask[P, R]]:
    """`@shared_task(bind=True, **options)`, typed: the function takes the task first; the
    task is called, and sent, without it."""
    decorate: Callable[[Callable[Concatenate[Task, P], R]], TypedTask[P, R]] = shared_task(bind=True, **options)
    return decorate


def on_signal(*signals: Signal, **options: object) -> Callable[[F], F]:
    """`@signal.connect(**options)` for each of `signals`, typed: the receiver is returned as
    it is. `options` are Celery's (`weak=False` keeps a receiver nothing else refers to)."""

    def connect(receiver: F) -> F:
        for signal in signals:
            signal.connect(receiver, **options)
        return receiver

    return connect
