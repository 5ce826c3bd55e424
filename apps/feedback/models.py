from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models

from apps.feedback.kinds import NAME_MAX, KindValue, kind_validate, value_parse

# Whoever a request is from (request.user), or a user row: who gives feedback and is handed items.
Person = AbstractBaseUser | AnonymousUser

# The review states (Feedback.review). Only a rejected row is left out of what the loop reads.
REVIEW_PENDING, REVIEW_ACCEPTED, REVIEW_REJECTED = "pending", "accepted", "rejected"


class FeedbackQuerySet(models.QuerySet["Feedback"]):
    def effective(self) -> FeedbackQuerySet:
        """The rows that take effect: every one but those the run's owner rejected on the review
        page (apps.feedback.review.services). What folds into rewards, the reward model's preference
        pairs, DPO's choices and the exports read only these."""
        return self.exclude(review=REVIEW_REJECTED)


class Feedback(models.Model):
    """One piece of feedback, stored as it came (who, what, when) and folded into rewards
    by the run's feedback settings.

    Every door stores it through the service of its kind (its module in `apps.feedback.kinds`), which
    builds `value` in the one shape of that kind (its typed model in `apps.feedback.kinds`,
    read back through `Feedback.parsed`):

    - rating: {"score": 1..5 | null, "thumb": "up" | "down" | null, "normalised": 0..1 | null}
      (one of score and thumb; normalised is what the fold reads. normalised is null
      only on rows migrated from an old API number with no readable scale, which then also
      carry "legacy": the number, and are never folded);
    - ranking: {"order": [every experience id of the group, best first]};
    - pairwise: {"winner": "a" | "b" | "tie"}, a = `experience`, b = `other`;
    - edit: {"expert_id": the expert experience holding the correction};
    - flag: {"flags": [subset of unsafe, broken, off_task], "reason": str};
    - env_reward: {"reward": number, "reward_parts": {name: number}}.
    """

    class Kind(models.TextChoices):
        # The built-in kinds' names, for the queries that read one kind's rows. The column
        # takes any kind registered in apps.feedback.kinds (no choices: a new kind needs no
        # migration); what each kind does (target, fold, pairs, doors) is its declaration there.
        RATING = "rating"
        RANKING = "ranking"
        PAIRWISE = "pairwise"
        EDIT = "edit"
        FLAG = "flag"
        ENV_REWARD = "env_reward"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="feedback")
    kind = models.CharField(max_length=NAME_MAX, validators=[kind_validate])
    # Target (the kind's `target`): one experience (rating, flag, edit, env_reward), a pair
    # (pairwise: experience is A, other is B), or a group (ranking: group_id, value holds the
    # ordered experience ids).
    experience = models.ForeignKey("buffer.Experience", null=True, blank=True, on_delete=models.CASCADE, related_name="feedback")
    other = models.ForeignKey("buffer.Experience", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    group_id = models.CharField(max_length=100, blank=True, db_index=True)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="feedback")
    api_key = models.ForeignKey("envapi.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="feedback")
    value = models.JSONField()
    comment = models.TextField(blank=True)
    # Arrived after its target was trained on: kept for DPO, SFT and export, and counted.
    late = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Review(models.TextChoices):
        """The owner's review (apps.feedback.review.services): pending until someone reviews it; a
        rejected row takes no effect (FeedbackQuerySet.effective)."""

        PENDING = REVIEW_PENDING
        ACCEPTED = REVIEW_ACCEPTED
        REJECTED = REVIEW_REJECTED

    review = models.CharField(max_length=8, choices=Review.choices, default=Review.PENDING)
    reviewed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    reviewed_at = models.DateTimeField(null=True, blank=True)

    objects = FeedbackQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["run", "kind", "created_at"], name="feedback_run_kind_idx"),
                   models.Index(fields=["run", "review"], name="feedback_run_review_idx")]

    def __str__(self) -> str:
        return f"{self.kind} on run {self.run_id}"

    @property
    def parsed(self) -> KindValue:
        """`value` as its kind's typed model (apps.feedback.kinds); `kinds.value_of(fb, Model)`
        when the reader needs one kind's fields."""
        return value_parse(kind=self.kind, raw=self.value)


class Assignment(models.Model):
    """An item of an annotator's queue, handed out under a lease.

    The run's overlap k is enforced by the database: an experience has k slots, and a
    partial unique constraint lets at most one live (leased or done) assignment hold each
    slot, so two concurrent claimers can never both take the last one. A skipped assignment
    frees its slot and keeps its row (the same annotator is not offered the item again);
    an abandoned one (lease expired) is deleted, which frees the slot too.
    """

    class Status(models.TextChoices):
        LEASED = "leased"
        DONE = "done"
        SKIPPED = "skipped"

    class Source(models.TextChoices):
        """Why the item was handed out: the selection rule's priority, the rule's random share,
        a gold item, or plain arrival order (no selection rule). Only random and arrival
        hand-outs are a sample the reward model did not choose, so only their labels give an
        unbiased accuracy (RewardModel.accuracy_random). Unknown: handed out before this was
        recorded, under a run whose config could have used either."""

        RULE = "rule"
        RANDOM = "random"
        GOLD = "gold"
        ARRIVAL = "arrival"
        UNKNOWN = "unknown"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="assignments")
    experience = models.ForeignKey("buffer.Experience", on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments")
    slot = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.LEASED)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.UNKNOWN)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # While leased: how long the item's group waits for this annotator (apps.feedback.handout.holds).
    held_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["experience", "annotator"], name="assignment_once_per_annotator"),
            models.UniqueConstraint(
                fields=["experience", "slot"],
                condition=models.Q(status__in=["leased", "done"]),
                name="assignment_live_slot",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "annotator", "status"], name="assignment_queue_idx"),
            models.Index(fields=["status", "lease_expires_at"], name="assignment_reap_idx",
                         condition=models.Q(status="leased")),
        ]

    def __str__(self) -> str:
        return f"assignment {self.pk}: experience {self.experience_id} to {self.annotator_id} ({self.status})"


class LabelTaught(models.Model):
    """What the run's reward-model versions recorded of one label, kept per label so the ledger
    (apps.feedback.ledger) reads it in one join however many versions the run has: the first
    version whose training pairs came from it (`taught`; None: none yet) and the newest
    version's reason it made no pair (`reason`: heldout or apps.feedback.reward_model.preferences'
    UNPAIRED_REASONS; "" when that version trained on it). Written with each version, one
    statement (apps.feedback.reward_model.versions.label_taught_record); the versions' own rows keep the
    whole sets (RewardModel.trained_on, held_out, unpaired)."""

    feedback = models.OneToOneField(Feedback, primary_key=True, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    taught = models.PositiveIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=16, blank=True, default="")
    # The newest version that read it (what `reason` is from).
    version = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"label {self.feedback_id}: " + (f"taught v{self.taught}" if self.taught else self.reason)
