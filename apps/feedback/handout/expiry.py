"""The wait windows: a group whose members have waited for people longer than its window
follows the fallback its feedback settings name (`feedback.fallback`: the automatic reward,
or dropped).

The window is `feedback.wait_seconds` under `blend` and `human` (people are the reward there).
Under `learned` before the reward model passes its gate, a group waits for people only while a
person could still label it in time: `hold_seconds` when nobody holds it, while a hold lasts
when someone does, and never past `wait_seconds` (`wait_window`, the one place it is decided).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Max, Min
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.handout.holds import holds_apply
from apps.feedback.kinds.fold import OPEN_STATUSES, group_fold, group_members_locked
from apps.feedback.reward_model.versions import reward_model_usable
from kernel.fold import DROP_REASON, reward_combine
from apps.runs.models import Run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpireResult:
    groups_ready: int
    groups_dropped: int


@dataclass(frozen=True)
class WaitWindow:
    """How long a group of the run waits for people before the fallback, in seconds from its
    oldest pending member: `unheld` while nobody holds it, at most `longest` however held."""

    unheld: float
    longest: float

    def ends(self, *, since: datetime, held_until: datetime | None) -> datetime:
        """When the window of a group pending since `since` ends, its hold (the latest of its
        members' `held_until`, lapsed or live; None: never held) as it stands."""
        end = since + timedelta(seconds=self.unheld)
        if held_until is not None:
            end = max(end, held_until)
        return min(end, since + timedelta(seconds=self.longest))


def wait_window(*, run: Run) -> WaitWindow:
    """The run's wait window now. Under `learned`, until the reward model passes its gate, a
    group nobody holds waits `hold_seconds` (the grace a person gets after their last sign of
    work), not `wait_seconds`: people label a sample there (about a tenth), so most groups
    wait for no one, and 600 s on every early step stalled the run (issue 62 item 2; the
    live-steering bench overrode the window to 30 s to run at all). A person picks a fresh
    group up within that grace, which holds it (the first items of their queue, renewed by
    their work, capped at `hold_cap_seconds` from hand-out: apps.feedback.handout.holds), and a
    held group waits while the hold lasts, so nothing a person is labelling is cut short. Their
    labels teach the reward model whether or not the group waited. Under `blend` and `human`
    people are the reward, so every group waits the whole `wait_seconds`; so does a `learned`
    run once its reward model scores (members nobody rated wait for no one then: what still
    pends waits as before) or where nothing can be held (`hold_seconds` 0: holds_apply)."""
    feedback_cfg = run.cfg.feedback
    longest = feedback_cfg.wait_seconds
    if feedback_cfg.mode == "learned" and holds_apply(run=run) and reward_model_usable(run=run) is None:
        return WaitWindow(unheld=min(feedback_cfg.hold_seconds, longest), longest=longest)
    return WaitWindow(unheld=longest, longest=longest)


def feedback_wait_expire(*, now: datetime | None = None, run_ids: Collection[int] | None = None) -> ExpireResult:
    """End the wait windows that have run out: for each group whose window (`wait_window`,
    from its oldest pending member) has ended, apply the run's fallback. Idempotent
    (conditional updates on status pending), so overlapping beats do no harm. `run_ids`: only
    these runs' windows (a bench ends its own runs' windows early and must leave every other
    run's alone); None, the beat's: every run's."""
    now = now or timezone.now()
    ready = dropped = 0
    runs = Run.objects.filter(experiences__status=Experience.Status.PENDING)
    if run_ids is not None:
        runs = runs.filter(pk__in=list(run_ids))
    for run in runs.distinct():
        for group_id in _groups_due(run=run, now=now):
            outcome = _group_expire(run=run, group_id=group_id)
            ready += outcome == "ready"
            dropped += outcome == "dropped"
    if ready or dropped:
        log.info("feedback_wait_expire: %d groups made trainable, %d dropped", ready, dropped)
    return ExpireResult(groups_ready=ready, groups_dropped=dropped)


def _groups_due(*, run: Run, now: datetime) -> list[str]:
    """The run's pending groups whose wait window has ended by `now`."""
    window = wait_window(run=run)
    # No window is shorter than `unheld`: groups younger than that are not read.
    rows = (Experience.objects.filter(run=run, status=Experience.Status.PENDING)
            .values("group_id").annotate(since=Min("created_at"), held=Max("held_until"))
            .filter(since__lte=now - timedelta(seconds=window.unheld))
            .values_list("group_id", "since", "held"))
    return [group for group, since, held in rows if window.ends(since=since, held_until=held) <= now]


def _fallback_human(members: Sequence[Experience]) -> float | None:
    """The human reward an unrated member stands in with when the wait window ends: the mean
    of its rated siblings' (None when no member is rated: the group then trains on the
    automatic reward alone). On the blended scale of its rated siblings (w_auto * auto +
    w_human * this), so it neither outranks a rated right answer nor is favoured over a rated
    wrong one for lack of a rating (the automatic reward alone, e.g. a format reward of 1.0
    beside rated members' 0.2 / 1.2, put every unrated member above every rated wrong one)."""
    rated = [m.human_reward for m in members if m.human_reward is not None and not m.is_expert]
    return sum(rated) / len(rated) if rated else None


def _group_expire(*, run: Run, group_id: str) -> str | None:
    feedback_cfg = run.cfg.feedback
    with transaction.atomic():
        members = group_members_locked(run=run, group_id=group_id)
        pending = [m for m in members if m.status == Experience.Status.PENDING]
        if not pending:
            return None
        group_fold(run=run, group_id=group_id, members=members)
        without = [m for m in pending if m.reward is None]
        if without and (feedback_cfg.fallback == "drop" or any(m.auto_reward is None for m in without)):
            # No usable reward for some member: a group with a hole cannot be trained on.
            Experience.objects.filter(pk__in=[m.pk for m in members], status__in=OPEN_STATUSES).update(
                status=Experience.Status.FILTERED,
                filter_reason=DROP_REASON if feedback_cfg.fallback == "drop"
                else "feedback: wait window ended and a member has neither human nor automatic reward",
            )
            outcome = "dropped"
        else:
            fill = _fallback_human(members)
            for m in without:
                reward = m.auto_reward if fill is None else reward_combine(feedback_cfg=feedback_cfg, auto=m.auto_reward, human=fill)
                Experience.objects.filter(pk=m.pk, status=Experience.Status.PENDING).update(reward=reward)
            Experience.objects.filter(pk__in=[m.pk for m in pending], status=Experience.Status.PENDING).update(
                status=Experience.Status.READY
            )
            outcome = "ready"
    return outcome
