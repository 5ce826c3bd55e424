"""Who waits for whom: the run modes as pure functions of the config (no Django, no I/O).

Steps are counted from 1: explore step k is the k-th batch of tasks explored, train step t
the t-th optimizer step. Model versions are numbered consecutively: v0 is the run config's
model, v(n) is published after train step n·sync_interval. One train step consumes one
explore step's experiences (train_batch_size = explore_batch_size × repeat_times).

- sync (Trinity-RFT semantics): the explorer does not sync while step ≤ sync_offset, then
  syncs every sync_interval steps, each time to the version trained on everything explored
  up to sync_offset steps before. Explore step k therefore uses exactly
  v(max(0, ⌊(k − 1 − offset) / interval⌋)) and waits until it exists. offset 0 and
  interval 1 is strictly on-policy; offset 1 is one-step off-policy.
- async: the explorer uses the newest version, and runs ahead of the trainer by at most
  max_staleness versions: step k waits for v(max(0, ⌊(k − 1) / interval⌋ − max_staleness)).
- explore: rollouts and evaluation with whatever version is current; no trainer.
- train: no explorer; the trainer trains on what the buffer holds, and on what environments
  (the REST API, agents through the OpenAI-compatible endpoint) send while tasks they
  claimed are queued or leased (`conductor.explore_finished`).
"""

from __future__ import annotations

from typing import Protocol

SYNC, ASYNC, EXPLORE, TRAIN = "sync", "async", "explore", "train"


class Schedule(Protocol):
    """What the schedule reads of a config: a RunConfig is one (plain objects in tests too)."""

    @property
    def mode(self) -> object: ...
    @property
    def sync_interval(self) -> int: ...
    @property
    def sync_offset(self) -> int: ...
    @property
    def max_staleness(self) -> int: ...


def _mode(cfg: Schedule) -> str:
    return str(getattr(cfg.mode, "value", cfg.mode))


def explores(cfg: Schedule) -> bool:
    return _mode(cfg) in (SYNC, ASYNC, EXPLORE)


def trains(cfg: Schedule) -> bool:
    return _mode(cfg) in (SYNC, ASYNC, TRAIN)


def version_for_train_step(*, cfg: Schedule, train_step: int) -> int:
    """The version the policy is after `train_step` steps (published at multiples of sync_interval)."""
    return max(0, train_step) // cfg.sync_interval


def publishes_at(*, cfg: Schedule, train_step: int) -> bool:
    """Whether train step t ends by publishing a new version."""
    return train_step > 0 and train_step % cfg.sync_interval == 0


def version_required(*, cfg: Schedule, explore_step: int) -> int:
    """The lowest model version explore step k may use; in sync mode, the one it must use."""
    if explore_step < 1:
        raise ValueError("explore steps are counted from 1")
    mode = _mode(cfg)
    if mode == SYNC:
        return max(0, (explore_step - 1 - cfg.sync_offset) // cfg.sync_interval)
    if mode == ASYNC:
        return max(0, (explore_step - 1) // cfg.sync_interval - cfg.max_staleness)
    return 0


def explore_version(*, cfg: Schedule, explore_step: int, current_version: int) -> int | None:
    """The version explore step k runs with now, or None when it must wait for the trainer."""
    mode = _mode(cfg)
    if mode == TRAIN:
        raise ValueError("a train-mode run does not explore")
    required = version_required(cfg=cfg, explore_step=explore_step)
    if current_version < required:
        return None
    # sync pins the version the schedule names (reproducible, even when the trainer got
    # ahead through a sync_offset); async and explore take the newest.
    return required if mode == SYNC else current_version


def min_version_for_claim(*, cfg: Schedule, current_version: int) -> int | None:
    """The oldest model version whose experiences the trainer may still claim, or None for
    no bound (train mode trains on whatever the buffer holds, imported data included)."""
    mode = _mode(cfg)
    if mode == SYNC:
        # The schedule's own lag: ⌈offset / interval⌉ versions, zero when on-policy.
        lag = -(-cfg.sync_offset // cfg.sync_interval)
        return max(0, current_version - lag)
    if mode == ASYNC:
        return max(0, current_version - cfg.max_staleness)
    return None


def staleness(*, current_version: int, experience_versions: list[int]) -> int:
    """How many versions behind the trainer the oldest experience of a batch is."""
    return max((current_version - v for v in experience_versions), default=0)
