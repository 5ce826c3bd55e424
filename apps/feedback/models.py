from __future__ import annotations

from django.conf import settings
from django.db import models


class Feedback(models.Model):
    """One piece of feedback, stored as it came (who, what, when) and folded into rewards
    by the run's feedback policy."""

    class Kind(models.TextChoices):
        RATING = "rating"
        RANKING = "ranking"
        PAIRWISE = "pairwise"
        EDIT = "edit"
        FLAG = "flag"
        ENV_REWARD = "env_reward"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="feedback")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    # Target: one experience (rating, flag, edit, env_reward), a pair (pairwise: experience is
    # A, other is B), or a group (ranking: group_id, value holds the ordered experience ids).
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

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["run", "kind", "created_at"], name="feedback_run_kind_idx")]

    def __str__(self) -> str:
        return f"{self.kind} on run {self.run_id}"
