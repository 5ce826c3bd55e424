"""The fold: a group's feedback folded into its open members' human and final rewards under
the run's feedback settings (the arithmetic is the kernel's, kernel.fold), making the group
trainable when every member's reward is final. The feedback services and the wait windows
call it with the group locked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Q

from apps.buffer.models import Experience
from apps.feedback.kinds import feedback_votes, kind_get, kind_names
from apps.feedback.models import Feedback
from apps.feedback.raters.reliability import rater_offsets_cached, rater_weights_cached
from kernel.fold import member_is_final, reward_combine, votes_fold
from apps.runs.models import Run

# The statuses whose rewards may still change.
OPEN_STATUSES = (Experience.Status.PENDING, Experience.Status.READY)


@dataclass(frozen=True)
class FoldResult:
    updated: int
    became_ready: bool


def group_members_locked(*, run: Run, group_id: str) -> list[Experience]:
    # Lock the group in id order (so two folds cannot deadlock) for the read-compute-write;
    # a second fold of the same group waits and then sees the first one's feedback.
    return list(
        Experience.objects.select_for_update()
        .filter(run=run, group_id=group_id, is_expert=False)
        .order_by("id")
    )


def group_feedback_to_fold(*, run: Run, group_id: str, member_ids: Sequence[int]) -> list[Feedback]:
    """The group's feedback of the kinds that fold: on a member, or (a group's kinds) on the group;
    none the owner rejected (apps.feedback.review.services)."""
    on = Q(pk__in=[])
    for name in kind_names(folds=True):
        target = kind_get(name).target
        on |= Q(kind=name, group_id=group_id) if target == "group" else Q(kind=name, experience_id__in=list(member_ids))
    return list(
        Feedback.objects.effective().filter(run=run, late=False).filter(on)
        .only("kind", "experience_id", "author_id", "api_key_id", "value")
    )


def group_fold(*, run: Run, group_id: str, members: list[Experience] | None = None) -> FoldResult:
    """Recompute the human and final rewards of a group's open members from their feedback,
    and make the group trainable when every member's reward is final. Call inside a
    transaction (the feedback services do); idempotent."""
    feedback_cfg = run.cfg.feedback
    if members is None:
        members = group_members_locked(run=run, group_id=group_id)

    ids = [m.pk for m in members]
    rows = group_feedback_to_fold(run=run, group_id=group_id, member_ids=ids)
    folds = votes_fold(member_ids=ids, votes=feedback_votes(rows), weights=rater_weights_cached(run=run),
                         offsets=rater_offsets_cached(run=run))
    changed: list[Experience] = []
    for m in members:
        if m.status not in OPEN_STATUSES:
            continue
        fold = folds[m.pk]
        human = fold.human
        reward = reward_combine(feedback_cfg=feedback_cfg, auto=m.auto_reward, human=human) if feedback_cfg.mode != "auto" else None
        before = (m.human_reward, m.reward)
        if human is not None:
            m.human_reward = human
        if reward is not None:
            m.reward = reward
        if (m.human_reward, m.reward) != before:
            changed.append(m)
    # One statement for the group, whatever its size (a ranking of 64 changes 64 rows): both
    # fields written on each changed row, the unchanged one as it was read under the lock.
    if changed:
        Experience.objects.bulk_update(changed, ["human_reward", "reward"])
    updated = len(changed)
    became_ready = False
    if feedback_cfg.mode != "auto" and any(m.status == Experience.Status.PENDING for m in members):
        if all(m.status != Experience.Status.PENDING or member_is_final(feedback_cfg=feedback_cfg, fold=folds[m.pk]) for m in members):
            became_ready = bool(
                Experience.objects.filter(pk__in=[m.pk for m in members], status=Experience.Status.PENDING).update(
                    status=Experience.Status.READY
                )
            )
    return FoldResult(updated=updated, became_ready=became_ready)

