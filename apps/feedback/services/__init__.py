"""Feedback services, by sub-domain: the hand-out (`handout`: the annotation queue's
assignments under a lease), the fold (`fold`: feedback into experience rewards under the run's
policy), submitting (`submit`: what every kind's service shares) and the wait windows (`expiry`). The
names other apps and the tests call are re-exported here; the modules import each other's
public names only. Each kind's own service is in its module (`feedback_rate` in
apps.feedback.kinds.rating, …), which imports these: they stand below the kinds' modules and
never import them (a kind they must read is read through the registry, apps.feedback.kinds)."""

from apps.feedback.services.expiry import ExpireResult, feedback_wait_expire
from apps.feedback.services.fold import FoldResult, group_fold
from apps.feedback.services.handout import (
    GOLD_SLOT_BASE,
    GOLD_SLOTS,
    assignment_claim,
    assignment_reap,
    assignment_skip,
    handout_rng,
    handout_rngs,
    slots_take,
)
from apps.feedback.services.submit import (
    ApiKeyRow, FeedbackClosed, feedback_rate_and_flag, feedback_store,
)

__all__ = [
    "GOLD_SLOTS", "GOLD_SLOT_BASE", "ApiKeyRow", "ExpireResult", "FeedbackClosed", "FoldResult", "assignment_claim",
    "assignment_reap", "assignment_skip", "feedback_rate_and_flag", "feedback_store",
    "feedback_wait_expire", "group_fold", "handout_rng", "handout_rngs", "slots_take",
]
