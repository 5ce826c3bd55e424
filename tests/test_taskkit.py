"""rftweb/taskkit.py: the typed task decorators and signal hook-up are Celery's own
underneath: a task is registered under its name, runs with its arguments, a bound one gets
itself first, and a receiver is connected to every signal named and returned as it is."""

from __future__ import annotations

from celery import Task
from celery.utils.dispatch import Signal

from rftweb.celery import app
from rftweb.taskkit import celery_bound_task, celery_task, on_signal


@celery_task(name="tests.test_taskkit.double")
def double(x: int, *, plus: int = 0) -> int:
    return 2 * x + plus


@celery_bound_task(name="tests.test_taskkit.named")
def named(self: Task, suffix: str) -> str:
    return f"{self.name}{suffix}"


def test_a_task_is_registered_under_its_name_and_runs_with_its_arguments() -> None:
    assert double.name == "tests.test_taskkit.double"
    assert app.tasks[double.name](5) == 10  # Celery's registry holds it (shared_task gives a proxy to it)
    assert double(3, plus=1) == 7
    assert double.apply(args=(4,), kwargs={"plus": 2}).get() == 10


def test_a_bound_task_gets_itself_first_and_is_called_without_it() -> None:
    assert named("!") == "tests.test_taskkit.named!"
    assert named.apply(args=("?",)).get() == "tests.test_taskkit.named?"


def test_a_receiver_is_connected_to_every_signal_named_and_returned_as_it_is() -> None:
    first, second = Signal(name="first"), Signal(name="second")
    heard: list[tuple[str, object]] = []

    def receiver(signal: Signal, sender: object = None, **_: object) -> None:
        heard.append((signal.name, sender))

    assert on_signal(first, second)(receiver) is receiver
    first.send(sender="a")
    second.send(sender="b")
    assert heard == [("first", "a"), ("second", "b")]


def test_options_reach_the_signal_a_strong_receiver_outlives_its_name() -> None:
    import gc

    signal = Signal(name="third")
    heard: list[object] = []

    def make() -> None:
        @on_signal(signal, weak=False)
        def receiver(sender: object = None, **_: object) -> None:
            heard.append(sender)

    make()
    gc.collect()
    signal.send(sender="c")
    assert heard == ["c"]
