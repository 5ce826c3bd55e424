from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiKey(models.Model):
    """An environment's key: stored hashed, scoped to runs and actions, revocable."""

    ACTIONS = ("read", "submit", "feedback")

    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, unique=True, help_text="shown in lists; not secret")
    hashed = models.CharField(max_length=128)
    runs = models.ManyToManyField("runs.Run", related_name="api_keys")
    actions = models.JSONField(default=list)
    rate_limit_per_minute = models.PositiveIntegerField(default=600)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="api_keys")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
