"""Blind side-by-side evaluation (docs/guide/blind-evaluation.md): people compare two answers
to a held-out prompt, versions hidden, and vote. Nothing here is feedback: no vote reaches
training, the reward model, rater reliability or the training exports (apps/feedback never
reads these tables)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.runs.models import Run


class Evaluation(models.Model):
    class Status(models.TextChoices):
        # The workers are writing the answers it lacks (workers/explore/blind.py).
        GENERATING = "generating"
        OPEN = "open"
        CLOSED = "closed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    # The vote page's address: opaque, so no URL names the run, a version or a step.
    token = models.CharField(max_length=32, unique=True)
    class Placement(models.TextChoices):
        # The vote page of its own, /vote/<token>/.
        PAGE = "page"
        # Also handed out between the items of the run's annotation page (apps/evaluation/between.py).
        BETWEEN = "between"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.GENERATING)
    # Where its pairs are shown to voters, the owner's choice: the vote page is always there.
    placement = models.CharField(max_length=16, choices=Placement.choices, default=Placement.PAGE)
    # The answers' sampling seed and the prompts' draw: recorded so the evaluation can be repeated.
    seed = models.BigIntegerField()
    votes_per_pair = models.PositiveIntegerField()
    # Empty: the run's owner and annotators vote.
    voters = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of run {self.run_id}"


class Entrant(models.Model):
    """A version compared: of the evaluation's run, or of another run its creator can see."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="entrants")
    # 0 is the baseline every win rate is against.
    position = models.PositiveIntegerField()
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()

    class Meta:
        ordering = ["evaluation", "position"]
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "position"], name="entrant_position_unique"),
            models.UniqueConstraint(fields=["evaluation", "run", "number"], name="entrant_version_unique"),
        ]

    def label(self, run_id: int) -> str:
        """"v3" for a version of run `run_id`, "run 12 v3" for another run's."""
        return f"v{self.number}" if self.run_id == run_id else f"run {self.run_id} v{self.number}"


class Prompt(models.Model):
    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="prompts")
    position = models.PositiveIntegerField()
    text = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)
    # sha256 of the prompt (text and messages): the answers' cache key.
    digest = models.CharField(max_length=64)

    class Meta:
        ordering = ["evaluation", "position"]


class Answer(models.Model):
    """A version's answer to a prompt at a seed, shared by every evaluation that asks for it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    version = models.PositiveIntegerField()
    digest = models.CharField(max_length=64)
    seed = models.BigIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "version", "digest", "seed"], name="answer_cache_unique")]


class Item(models.Model):
    """A pair shown to voters: a prompt, the answer on the left and on the right (the sides
    drawn at random and stored). A planted check has the same answer on both sides."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="items")
    prompt = models.ForeignKey(Prompt, on_delete=models.CASCADE, related_name="+")
    left = models.ForeignKey(Entrant, on_delete=models.CASCADE, related_name="+")
    right = models.ForeignKey(Entrant, on_delete=models.CASCADE, related_name="+")
    left_answer = models.ForeignKey(Answer, on_delete=models.PROTECT, related_name="+")
    right_answer = models.ForeignKey(Answer, on_delete=models.PROTECT, related_name="+")
    is_check = models.BooleanField(default=False)
    # The vote page's name for it: opaque and random.
    token = models.CharField(max_length=32, unique=True)
    # Presentation order (shuffled, so checks and pairs are interleaved).
    order = models.PositiveIntegerField()

    class Meta:
        ordering = ["evaluation", "order"]


class Vote(models.Model):
    class Choice(models.TextChoices):
        LEFT = "left"
        RIGHT = "right"
        TIE = "tie"
        BOTH_BAD = "both_bad"

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="votes")
    voter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    choice = models.CharField(max_length=10, choices=Choice.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        # Each pair's votes come from different people, and nobody sees a pair twice.
        constraints = [models.UniqueConstraint(fields=["item", "voter"], name="vote_once_per_item")]
