"""The wait windows: a group whose members have waited longer than the run's `wait_seconds`
for people follows the policy's fallback (the automatic reward, or dropped)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.buffer.models import Experience
from apps.feedback.kinds.fold import OPEN_STATUSES, group_fold, group_members_locked
from kernel.fold import DROP_REASON, reward_combine
from apps.runs.models import Run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpireResult:
    groups_ready: int
    groups_dropped: int


def feedback_wait_expire(*, now: datetime | None = None, run_ids: Collection[int] | None = None) -> ExpireResult:
    """End the wait windows that have run out: for each group with a member pending longer
    than its run's `wait_seconds`, apply the run's fallback. Idempotent (conditional
    updates on status pending), so overlapping beats do no harm. `run_ids`: only these runs'
    windows (a bench ends its own runs' windows early and must leave every other run's alone);
    None, the beat's: every run's."""
    now = now or timezone.now()
    ready = dropped = 0
    runs = Run.objects.filter(experiences__status=Experience.Status.PENDING)
    if run_ids is not None:
        runs = runs.filter(pk__in=list(run_ids))
    for run in runs.distinct():
        feedback_cfg = run.cfg.feedback
        cutoff = now - timedelta(seconds=feedback_cfg.wait_seconds)
        groups = list(
            Experience.objects.filter(run=run, status=Experience.Status.PENDING, created_at__lte=cutoff)
            .values_list("group_id", flat=True).distinct()
        )
        for group_id in groups:
            outcome = _group_expire(run=run, group_id=group_id)
            ready += outcome == "ready"
            dropped += outcome == "dropped"
    if ready or dropped:
        log.info("feedback_wait_expire: %d groups made trainable, %d dropped", ready, dropped)
    return ExpireResult(groups_ready=ready, groups_dropped=dropped)


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
