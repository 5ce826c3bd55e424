"""A Celery task's registered name is where its code is: `<module>.<function>` (issue #48),
so a name in a log line, a failure row or the workers page leads to the file."""

from __future__ import annotations

from rftweb.celery import app

# Every name has moved (round 49 moved the last one, the reward-model beat).
NOT_YET: dict[str, str] = {}


def registered() -> dict[str, str]:
    """Every project task's name -> where its function is."""
    app.loader.import_default_modules()
    return {name: f"{task.run.__module__}.{task.run.__name__}" for name, task in app.tasks.items()
            if not name.startswith("celery.")}


def test_every_task_is_named_after_its_module_and_function() -> None:
    misnamed = {name: where for name, where in registered().items() if name != where}
    assert misnamed == {}


def test_the_beat_schedule_and_the_routes_name_registered_tasks() -> None:
    names = set(registered())
    assert {entry["task"] for entry in app.conf.beat_schedule.values()} <= names
    for pattern in app.conf.task_routes:
        prefix = pattern.removesuffix("*")
        assert any(name.startswith(prefix) for name in names), pattern
