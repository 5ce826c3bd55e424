"""What the run learns about its own rewards: reward models trained from its human feedback
(versioned like the policy), their scores of experiences, and gold items (experiences whose
answer the owner knows, used to measure raters)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class VersionedScorer(models.Model):
    """What a learned scorer's published version holds, whatever it learned from: a directory,
    the base it was trained from, its held-out pairwise accuracy and the calibration that puts
    its raw scores on the [0, 1] scale. RewardModel and K12Grader are its two kinds."""

    version = models.PositiveIntegerField()
    # A directory loadable by AutoModelForSequenceClassification (and its tokenizer).
    path = models.CharField(max_length=1000)
    base = models.CharField(max_length=1000, help_text="the model it was trained from")
    # Pairwise accuracy on the held-out share of the pairs (None: no held-out pair).
    accuracy = models.FloatField(null=True, blank=True)
    pairs_train = models.PositiveIntegerField(default=0)
    pairs_heldout = models.PositiveIntegerField(default=0)
    seconds = models.FloatField(default=0.0, help_text="training time")
    # A raw score s is put on the [0, 1] scale as clamp(scale * s + offset, 0, 1), fitted on
    # the human rewards (or grades) of the rated items at publication.
    scale = models.FloatField(default=1.0)
    offset = models.FloatField(default=0.5)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["run", "version"]

    def calibrated(self, score: float) -> float:
        """A raw score on the [0, 1] scale."""
        return min(1.0, max(0.0, self.scale * score + self.offset))


class RewardModelManager(models.Manager["RewardModel"]):
    """Reads versions without the label sets they recorded (`RewardModel.LABEL_SETS`): they
    grow with the run's labels, and only the ledger's record (written from the version as it is
    published) and an audit read them; a deferred field still loads when it is read."""

    def get_queryset(self) -> models.QuerySet[RewardModel]:
        return super().get_queryset().defer(*RewardModel.LABEL_SETS)


class RewardModel(VersionedScorer):
    """One published version of a run's learned reward model (workers/reward/trainer.py)."""

    LABEL_SETS = ("trained_on", "held_out", "unpaired")

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="reward_models")
    # How many labels (feedback rows) the run had when this version's data was read.
    labels = models.PositiveIntegerField(default=0)
    # The unbiased estimate: pairwise accuracy on the held-out (cross-validated: out-of-fold)
    # pairs both of whose completions only the random share or arrival order handed out
    # (Assignment.source). The selection rule hands out the pairs that straddle the model's
    # decision, so `accuracy` over every held-out pair is no estimate of how it ranks the rest.
    # None: no such pair (pairs_random 0), or a version from before this was measured (both None).
    accuracy_random = models.FloatField(null=True, blank=True)
    pairs_random = models.PositiveIntegerField(null=True, blank=True)
    # The labels (feedback ids) this version's training pairs came from (PreferencePair.feedback_ids),
    # those whose every pair it held out for its evaluation (not trained on), and why each other
    # label it read made no pair ({reason: [ids]}, apps.feedback.reward_model.preferences.UNPAIRED_REASONS):
    # what the ledger (apps.feedback.ledger) reads to say a label taught the reward model. Written
    # once, with the version; empty for a version from before they were recorded.
    trained_on = models.JSONField(default=list, blank=True)
    held_out = models.JSONField(default=list, blank=True)
    unpaired = models.JSONField(default=dict, blank=True)

    objects = RewardModelManager()

    class Meta(VersionedScorer.Meta):
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="reward_model_version_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} reward model v{self.version}"


class RewardModelScore(models.Model):
    """A reward model version's score of one experience; the version is part of the row."""

    experience = models.ForeignKey("buffer.Experience", on_delete=models.CASCADE, related_name="rm_scores")
    reward_model = models.ForeignKey(RewardModel, on_delete=models.CASCADE, related_name="scores")
    score = models.FloatField()
    # How far the version's ensemble of heads disagrees about this score (their standard
    # deviation, raw scale); None for a kind with no ensemble. The selection rule reads it.
    spread = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["experience", "reward_model"], name="rm_score_unique")]

    def __str__(self) -> str:
        return f"{self.experience_id}: {self.score:.3f} (rm {self.reward_model_id})"


class GoldItem(models.Model):
    """An experience whose right rating the owner knows; mixed into annotators' queues at the
    run's `feedback.gold_rate`, never announced, and used to measure each rater."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="gold_items")
    experience = models.ForeignKey("buffer.Experience", on_delete=models.CASCADE, related_name="+")
    # The known answer on the human scale [0, 1] (a 1..5 rating r is (r - 1) / 4).
    answer = models.FloatField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "experience"], name="gold_item_unique")]

    def __str__(self) -> str:
        return f"gold {self.experience_id} = {self.answer}"


class K12Grader(VersionedScorer):
    """One published version of a run's learned K-12 grader (workers/reward/k12.py): a scalar-head
    reward model trained on graded answers to K-12 questions (the taskset's `graded_answers`
    and people's ratings of K-12 experiences). Versioned like RewardModel (numbered per run,
    published with its held-out pairwise accuracy), but kept apart from it: it scores one
    domain's answers against their reference and never stands in for people's feedback."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="k12_graders")
    # How many graded answers the run had when this version's data was read.
    grades = models.PositiveIntegerField(default=0)

    class Meta(VersionedScorer.Meta):
        constraints = [models.UniqueConstraint(fields=["run", "version"], name="k12_grader_version_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} K-12 grader v{self.version}"
