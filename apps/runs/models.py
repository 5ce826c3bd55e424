from __future__ import annotations

import hashlib
import json

from django.conf import settings
from django.db import models

from kernel.config import RunConfig, config_validate


class Run(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPED = "stopped"
        # Every step the config asks for is done; a finished run is not started again.
        FINISHED = "finished"
        # Its workers failed repeatedly, or it could not start; `error` says why.
        FAILED = "failed"

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT, db_index=True)
    # The stored JSON, always written through config_validate, so it holds a valid RunConfig's
    # JSON; `cfg` is the same config validated (a RunConfig).
    config = models.JSONField()
    taskset = models.ForeignKey("buffer.Taskset", null=True, blank=True, on_delete=models.PROTECT, related_name="runs")
    current_version = models.PositiveIntegerField(default=0)
    explore_step = models.PositiveIntegerField(default=0)
    train_step = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # The run this one is the twin of (apps/control/twins.py): a copy with people's feedback
    # off. A column, not only the copy's audit entry, so that every door's one check whether
    # a run takes labels (apps.runs.selectors.run_takes_feedback) reads it with the run.
    twin_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="twins")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk})"

    @property
    def cfg(self) -> RunConfig:
        """The stored `config` JSON validated: a RunConfig, cached until `config` changes."""
        cached: RunConfig | None = getattr(self, "_cfg_cache", None)
        if cached is None or getattr(self, "_cfg_source", None) is not self.config:
            cached = config_validate(data=self.config)
            self._cfg_cache, self._cfg_source = cached, self.config
        return cached

    def cfg_known(self, cfg: RunConfig) -> None:
        """`cfg` is this row's config, validated where it was written (run_create): `cfg` keeps
        it instead of validating the stored JSON again."""
        self._cfg_cache, self._cfg_source = cfg, self.config

    @property
    def config_digest(self) -> str:
        """A fingerprint of the stored config: equal digests, equal configs. A rollout worker
        keeps a run's config between chat calls under it (workers/explore/chat.py) and reads the run
        again when the web side sends another (an edited config, e.g. new feedback settings)."""
        raw = json.dumps(self.config, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(raw.encode()).hexdigest()[:32]


class RunMember(models.Model):
    """Who may do what on a run besides its owner and staff."""

    class Role(models.TextChoices):
        ANNOTATOR = "annotator"
        VIEWER = "viewer"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="run_memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "user"], name="run_member_unique")]

    def __str__(self) -> str:
        return f"{self.user} {self.role} of {self.run_id}"


class Invitation(models.Model):
    """An owner's invitation to a run with a role, by email address or as a one-time link
    (apps/runs/invitations.py). Only a digest of its token is kept: the link is shown or
    sent once. Whoever opens it first, before it expires, becomes a member of the run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="invitations")
    role = models.CharField(max_length=16, choices=RunMember.Role.choices)
    # Empty for a one-time link handed over by other means.
    email = models.EmailField(blank=True)
    token_digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation to run {self.run_id} as {self.role}"


class ModelVersion(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    # A directory (shared storage) or hub id the explorers load.
    checkpoint = models.CharField(max_length=1000)
    train_step = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="model_version_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} v{self.number}"


class Metric(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    value = models.FloatField()
    time = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["run", "name", "step"], name="metric_chart_idx")]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"


class AuditEntry(models.Model):
    """Who did what to a run, and when (controls, feedback settings edits)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="audit")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=50)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.action} on {self.run_id} by {self.actor_id}"



class TaskFailure(models.Model):
    """A run's explore or train task raised: what, where and when, for the run page's
    worker-errors panel and for failing a run whose steps keep failing
    (apps.runs.failures)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="task_failures")
    task = models.CharField(max_length=200)
    step = models.IntegerField(null=True, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    exception = models.CharField(max_length=200)
    message = models.TextField(blank=True)
    # explore_step + train_step when it failed: failures at the same progress are "in a row".
    progress = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["run", "-created_at"], name="task_failure_run_idx")]

    def __str__(self) -> str:
        return f"{self.task} of run {self.run_id}: {self.exception}"


class WeightLoad(models.Model):
    """An explorer loaded a model version: the weight-sync timeline."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="weight_loads")
    version = models.PositiveIntegerField()
    worker = models.CharField(max_length=200)
    seconds = models.FloatField(default=0.0, help_text="how long the load took")
    loaded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "loaded_at"]
        indexes = [models.Index(fields=["run", "version"], name="weight_load_run_idx")]


class SyncFailure(models.Model):
    """A weight sync or handover that failed or ran past the run's `sync_timeout_s`
    (workers.weights.sync.SyncFailed): what, where and why, on the weight-sync timeline."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="sync_failures")
    version = models.PositiveIntegerField()
    # checkpoint, memory, adapter or nccl; and the stage: write, load, broadcast, receive, …
    method = models.CharField(max_length=40)
    stage = models.CharField(max_length=80)
    where = models.CharField(max_length=1000, help_text="the path or group address")
    worker = models.CharField(max_length=200)
    seconds = models.FloatField(default=0.0, help_text="how long it ran before it failed")
    message = models.TextField(blank=True)
    failed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "failed_at"]
        indexes = [models.Index(fields=["run", "version"], name="sync_failure_run_idx")]


class WorkerHeartbeat(models.Model):
    """A Celery worker's last sign of life, written by the worker itself (apps.runs.heartbeat).

    One row per worker node name, upserted every few seconds from a thread in the worker's
    main process; a row whose `last_seen` is older than a few intervals is a dead worker.
    """

    hostname = models.CharField(max_length=200, unique=True)
    queues = models.JSONField(default=list)
    pool = models.CharField(max_length=50, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    pid = models.PositiveIntegerField(default=0)
    # [{"id", "name", "args", "started_at"}] of the tasks the worker is executing now.
    active = models.JSONField(default=list, blank=True)
    processed = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname


class Dispatch(models.Model):
    """A background job of a run that must not run twice at once: one row per run, job and
    key, the project's whole scheduling state, claimed only through apps/runs/dispatch.py.

    idle → sent (a message `task_id` is queued for it) → running (the worker that got it,
    with the lease owner it claims under) → idle (the task ended, whatever its outcome).
    The loop's explore and train steps (apps/control/conductor.py) are taken back by the
    conductor when their worker dies; the other jobs carry a lease (`expires_at`) after
    which a new claim takes them over.
    """

    class Job(models.TextChoices):
        # The RFT loop's steps (apps/control/conductor.py): one row per run, no key.
        EXPLORE = "explore"
        TRAIN = "train"
        # A version's weights packed as a download (the run summary's button); `step` is the
        # version number. One at a time per run, sent and taken back by the conductor like a step.
        EXPORT = "export"
        # The run's reward-model and K-12 grader training (workers/reward/trainer.py, workers/reward/k12.py).
        RM_TRAIN = "rm_train"
        K12_TRAIN = "k12_train"
        # A reward-model version packed as a download (apps/rewards/rm_download.py); key: the version.
        RM_EXPORT = "rm_export"

    class State(models.TextChoices):
        IDLE = "idle"
        SENT = "sent"
        RUNNING = "running"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="dispatches")
    job = models.CharField(max_length=16, choices=Job.choices)
    # What the job is about within its run, where a run has several ("v3": a version).
    key = models.CharField(max_length=64, blank=True, default="")
    step = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IDLE)
    task_id = models.CharField(max_length=64, blank=True)
    # The Celery node running it (its WorkerHeartbeat.hostname) and the name its leases carry.
    worker = models.CharField(max_length=200, blank=True)
    holder = models.CharField(max_length=200, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    # Past it a sent or running row is free again (its job crashed); None: no lease.
    expires_at = models.DateTimeField(null=True, blank=True)
    # The last run's failure, shown until the next claim (an export's page says why).
    error = models.CharField(max_length=500, blank=True, default="")
    # How many times a message was queued for it (re-sends after a lost message or worker).
    sends = models.PositiveIntegerField(default=0)
    # Copies of the current message queued since the row was last sent afresh (from idle, or
    # taken back from a worker that died): the conductor waits longer before each next copy
    # (apps/control/conductor.py), so a message waiting on a busy queue is not piled up there.
    copies = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "job", "key"], name="dispatch_run_job_key_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.job}{':' + self.key if self.key else ''}:{self.step} {self.state}"


class Notification(models.Model):
    """A run ended (finished, failed or stopped): one row per person told, shown by the header's
    unread badge and the notifications page, emailed to those who want it
    (apps/control/notifications.py). `key` names the end (run, end state and the audit entry
    of that transition): a task that runs twice, or an end reported twice, tells nobody twice."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notifications")
    key = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=Run.Status.choices)
    # The run's error for a failure, else empty.
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    read_at = models.DateTimeField(null=True, blank=True)
    # When its email went out; None: not wanted, or not sent yet (a retry sends it).
    emailed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="notification_user_key_unique")]
        indexes = [models.Index(fields=["user", "read_at"], name="notification_unread_idx")]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.state} for {self.user_id}"


class NotificationPreference(models.Model):
    """Whether a person wants an email when a run ends. No row: the default, on for the run's
    owner and off for its members."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="notification_preferences")
    email = models.BooleanField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "run"], name="notification_preference_unique")]
