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


class AgentSession(models.Model):
    """An agent's conversation through the OpenAI-compatible endpoint, named by the client;
    finishing it turns its recorded calls into experiences (apps/envapi/agent_sessions.py)."""

    class Status(models.TextChoices):
        OPEN = "open"
        FINISHED = "finished"
        ABANDONED = "abandoned"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="agent_sessions")
    name = models.CharField(max_length=200, help_text="the client's session id")
    api_key = models.ForeignKey(ApiKey, null=True, on_delete=models.SET_NULL, related_name="agent_sessions")
    task = models.ForeignKey("buffer.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="agent_sessions")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)
    reward = models.FloatField(null=True, blank=True)
    reward_parts = models.JSONField(default=dict, blank=True)
    experience_ids = models.JSONField(default=list, blank=True)
    # How the calls became experiences: segments, and why a trajectory was split.
    assembly = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_call_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="agent_session_name_unique")]
        indexes = [models.Index(fields=["status", "last_call_at"], name="agent_session_expiry_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.status})"


class AgentCall(models.Model):
    """One generation call of a session, exactly as the model saw and sampled it."""

    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="calls")
    index = models.PositiveIntegerField()
    # Which OpenAI-compatible door took it: "chat" (chat/completions) or "completion" (completions).
    endpoint = models.CharField(max_length=12)
    model_version = models.PositiveIntegerField()
    prompt_token_ids = models.JSONField(default=list)
    # One entry per choice: {"token_ids", "logprobs", "finish_reason", "text"}.
    choices = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "index"], name="agent_call_index_unique")]
        ordering = ["session", "index"]
