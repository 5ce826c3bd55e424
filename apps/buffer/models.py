from __future__ import annotations

from django.db import models
from django.db.models import Q


class Taskset(models.Model):
    name = models.CharField(max_length=200)
    owner = models.ForeignKey("auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="tasksets")
    source = models.CharField(max_length=1000, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Import(models.TextChoices):
        """Where the taskset's import stands: `ready` for every taskset imported inside its
        request; an upload past RFT_UPLOAD_BACKGROUND_BYTES is `queued`, then `importing` on
        a Celery task (apps/buffer/tasks.py), then `ready` or `failed` (its tasks removed)."""

        QUEUED = "queued"
        IMPORTING = "importing"
        READY = "ready"
        FAILED = "failed"

    import_status = models.CharField(max_length=10, choices=Import.choices, default=Import.READY)
    # Source records read so far and in all (None while unknown); the failure, naming the line.
    import_rows = models.PositiveIntegerField(default=0)
    import_total = models.PositiveIntegerField(null=True, blank=True)
    import_error = models.TextField(blank=True)
    # When the importing task took it: a claim older than the task's time limit is taken back.
    import_started_at = models.DateTimeField(null=True, blank=True)

    # Not a column: the importers set it on the taskset they return, to say what the import
    # pipeline's operators did ("operator/outcome": count); each task keeps its own reason.
    pipeline_counts: dict[str, int]

    def __str__(self) -> str:
        return self.name


class Task(models.Model):
    taskset = models.ForeignKey(Taskset, on_delete=models.CASCADE, related_name="tasks")
    index = models.PositiveIntegerField(help_text="position in the source file")
    # Either a text prompt or chat messages ([{"role": ..., "content": ...}]).
    prompt = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)
    # The reference answer (text or structure) and, for code, the tests.
    reference = models.JSONField(null=True, blank=True)
    tests = models.JSONField(null=True, blank=True)
    domain = models.CharField(max_length=50, default="general", db_index=True)
    metadata = models.JSONField(default=dict, blank=True)
    # The task's pictures, in prompt order: sha256 digests of files in the image store
    # (apps/buffer/images.py), never the bytes; each has a TasksetImage row of the taskset.
    images = models.JSONField(default=list, blank=True)
    is_synthetic = models.BooleanField(default=False)
    filter_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["taskset", "index"]
        constraints = [models.UniqueConstraint(fields=["taskset", "index"], name="task_index_unique")]

    def __str__(self) -> str:
        return f"task {self.taskset_id}/{self.index}"


class TasksetImage(models.Model):
    """A picture some task of the taskset shows: the file is in the image store under its
    digest (shared by every taskset holding the same bytes); this row says which taskset may
    show it (so who may see it) and what it is. `name` is the uploader's file name: untrusted
    text, shown escaped."""

    taskset = models.ForeignKey(Taskset, on_delete=models.CASCADE, related_name="images")
    sha256 = models.CharField(max_length=64)
    content_type = models.CharField(max_length=20)
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    size = models.PositiveIntegerField()
    name = models.CharField(max_length=255, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["taskset", "sha256"], name="taskset_image_unique")]


class TaskAttempt(models.Model):
    """One exploration of one task in one run and epoch: what explorers claim under a lease.

    Its id is the stable base of the idempotency keys of the experiences it produces, so a
    retried explorer writes the same keys again and nothing twice.
    """

    class Status(models.TextChoices):
        QUEUED = "queued"
        LEASED = "leased"
        DONE = "done"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="task_attempts")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="attempts")
    epoch = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    priority = models.FloatField(default=0.0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    model_version = models.PositiveIntegerField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "task", "epoch"], name="task_attempt_unique")]
        indexes = [
            models.Index(fields=["run", "status", "epoch", "priority", "id"], name="attempt_claim_idx"),
            models.Index(fields=["status", "lease_expires_at"], name="attempt_reap_idx", condition=Q(status="leased")),
        ]


class Experience(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending feedback"
        READY = "ready"
        LEASED = "leased"
        CONSUMED = "consumed"
        FILTERED = "filtered"

    class Source(models.TextChoices):
        EXPLORER = "explorer"
        ENV = "env"
        HUMAN = "human"
        IMPORT = "import"
        SYNTHETIC = "synthetic"

    # Every full index costs each claim and ack one entry per row (a status change cannot be
    # a HOT update), so the table keeps few: run_id leads the composite indexes below.
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="experiences", db_index=False)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="experiences")
    # Members of one GRPO group share a group id (the completions of one prompt).
    group_id = models.CharField(max_length=100)
    key = models.CharField(max_length=200, help_text="idempotency key, unique per run")
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.EXPLORER)
    prompt_text = models.TextField(blank=True)
    response_text = models.TextField(blank=True)
    messages = models.JSONField(null=True, blank=True)
    # prompt followed by response; logprobs and action_mask cover the response part only.
    token_ids = models.JSONField(default=list, blank=True)
    prompt_length = models.PositiveIntegerField(default=0)
    logprobs = models.JSONField(null=True, blank=True)
    action_mask = models.JSONField(null=True, blank=True)
    finish_reason = models.CharField(max_length=20, blank=True)
    reward = models.FloatField(null=True, blank=True)
    auto_reward = models.FloatField(null=True, blank=True)
    human_reward = models.FloatField(null=True, blank=True)
    reward_parts = models.JSONField(default=dict, blank=True)
    model_version = models.PositiveIntegerField(default=0)
    is_expert = models.BooleanField(default=False)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="corrections", db_index=False
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.READY)
    filter_reason = models.CharField(max_length=200, blank=True)
    priority = models.FloatField(default=0.0)
    use_count = models.PositiveIntegerField(default=0)
    # The train step that first trained on it (batch_commit_step); None: never, or trained
    # before this was recorded (use_count says so then).
    trained_step = models.PositiveIntegerField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Held for a person who has the group open on their annotation page: the trainer's claim
    # skips the group until then (set on every member by apps.feedback's holds; the run's
    # feedback.hold_seconds and hold_cap_seconds bound it).
    held_until = models.DateTimeField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="experience_key_unique")]
        indexes = [
            # Only ready rows: the claim scans it, and leased or consumed rows leave it.
            models.Index(fields=["run", "-priority", "id"], name="experience_claim_idx", condition=Q(status="ready")),
            models.Index(fields=["run", "group_id", "status"], name="experience_group_idx"),
            # Only rows in flight (pending feedback or leased): small whatever the run's size, it
            # finds the groups a whole-group claim must wait for, and the leases to reap.
            models.Index(fields=["run", "group_id"], name="experience_inflight_idx",
                         condition=Q(status__in=["pending", "leased"])),
            # Only corrections have a parent: a partial index serves them and costs the rest nothing.
            models.Index(fields=["parent"], name="experience_parent_idx", condition=Q(parent__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"experience {self.pk} ({self.status})"

    @property
    def response_length(self) -> int:
        return max(0, len(self.token_ids or []) - self.prompt_length)
