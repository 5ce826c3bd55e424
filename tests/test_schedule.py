"""The run modes' schedule (apps/runs/schedule.py): pure functions, no database."""

from __future__ import annotations

import pytest

from apps.runs import schedule
from kernel.config import config_validate


def cfg(**kw: object):
    base: dict[str, object] = {"model": "m", "rewards": [{"name": "exact_match"}]}
    base.update(kw)
    return config_validate(data=base)


def test_sync_on_policy_waits_for_the_version_trained_on_the_previous_step() -> None:
    c = cfg(mode="sync", sync_interval=1, sync_offset=0)
    assert [schedule.version_required(cfg=c, explore_step=k) for k in range(1, 6)] == [0, 1, 2, 3, 4]


def test_sync_offset_one_is_one_step_off_policy() -> None:
    c = cfg(mode="sync", sync_interval=1, sync_offset=1)
    assert [schedule.version_required(cfg=c, explore_step=k) for k in range(1, 6)] == [0, 0, 1, 2, 3]


def test_sync_interval_keeps_a_version_for_interval_steps() -> None:
    c = cfg(mode="sync", sync_interval=2, sync_offset=0)
    assert [schedule.version_required(cfg=c, explore_step=k) for k in range(1, 8)] == [0, 0, 1, 1, 2, 2, 3]


def test_sync_pins_the_scheduled_version_and_waits_when_it_is_missing() -> None:
    c = cfg(mode="sync", sync_offset=1)
    assert schedule.explore_version(cfg=c, explore_step=3, current_version=0) is None
    assert schedule.explore_version(cfg=c, explore_step=3, current_version=1) == 1
    assert schedule.explore_version(cfg=c, explore_step=3, current_version=2) == 1


def test_async_runs_ahead_at_most_max_staleness_versions() -> None:
    c = cfg(mode="async", max_staleness=2)
    assert [schedule.explore_version(cfg=c, explore_step=k, current_version=0) for k in range(1, 6)] == [0, 0, 0, None, None]
    assert schedule.explore_version(cfg=c, explore_step=4, current_version=5) == 5


def test_the_trainer_claims_only_what_the_mode_allows() -> None:
    assert schedule.min_version_for_claim(cfg=cfg(mode="sync"), current_version=4) == 4
    assert schedule.min_version_for_claim(cfg=cfg(mode="sync", sync_offset=1), current_version=4) == 3
    assert schedule.min_version_for_claim(cfg=cfg(mode="sync", sync_offset=3, sync_interval=2), current_version=4) == 2
    assert schedule.min_version_for_claim(cfg=cfg(mode="async", max_staleness=2), current_version=1) == 0
    assert schedule.min_version_for_claim(cfg=cfg(mode="async", max_staleness=2), current_version=5) == 3
    assert schedule.min_version_for_claim(cfg=cfg(mode="train", algorithm="sft"), current_version=5) is None


@pytest.mark.parametrize("interval,offset", [(1, 0), (1, 1), (2, 0), (2, 1), (3, 2)])
def test_in_sync_mode_what_the_explorer_makes_the_trainer_may_claim(interval: int, offset: int) -> None:
    """Step by step, train step t consumes explore step t: the version explore step t used
    is never below the trainer's claim bound at t (nothing is left behind as stale)."""
    c = cfg(mode="sync", sync_interval=interval, sync_offset=offset)
    for t in range(1, 30):
        made_with = schedule.version_required(cfg=c, explore_step=t)
        trainer_version = schedule.version_for_train_step(cfg=c, train_step=t - 1)
        floor = schedule.min_version_for_claim(cfg=c, current_version=trainer_version)
        assert floor is None or made_with >= floor
        assert made_with <= trainer_version


def test_modes_say_which_sides_run() -> None:
    assert schedule.explores(cfg(mode="explore")) and not schedule.trains(cfg(mode="explore"))
    assert schedule.trains(cfg(mode="train", algorithm="sft")) and not schedule.explores(cfg(mode="train", algorithm="sft"))
    assert schedule.explores(cfg(mode="async")) and schedule.trains(cfg(mode="async"))
    with pytest.raises(ValueError):
        schedule.explore_version(cfg=cfg(mode="train", algorithm="sft"), explore_step=1, current_version=0)
