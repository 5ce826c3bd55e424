"""Run lifecycle services."""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Protocol

from django.contrib.auth.models import User
from django.db import transaction
from django.dispatch import Signal

from kernel.input_checks import InputRejected, text_check
from apps.runs import schedule
from kernel import plugin_names
from kernel.config import ConfigInvalid, RunConfig, config_dump, config_validate
from apps.runs.events import event_publish, runs_list_touch
from apps.runs.invitations import Actor
from apps.runs.metrics import metric_record
from apps.runs.models import AuditEntry, ModelVersion, Run, RunMember, SyncFailure, WeightLoad
from apps.runs.selectors import eval_best
from kernel.model_dirs import TOKENIZER, has_any, model_dir_missing, model_missing_said
from kernel.exceptions import Conflict, InvalidInput
from kernel.jsontypes import Body
from rftweb.celery import app


class TransitionNotAllowed(Conflict):
    """The run is not in a status the action can start from."""

    code = "transition_not_allowed"


class RunCannotStart(TransitionNotAllowed):
    """The run's model, taskset or rewards do not allow it to start; `errors` maps fields
    (`model`, `taskset`, `rewards.0.params`) to messages."""

    code = "run_cannot_start"

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__("cannot start: " + "; ".join(f"{k}: {v}" for k, v in errors.items()), errors=errors)


# A hub id: "name" or "org/name" of word characters, '-', '_' and '.', not starting or
# ending with '-' or '.' (huggingface_hub's rules, letters beyond ASCII let through).
_HUB_ID = re.compile(r"^\w(?:[\w.-]{0,94}\w)?(?:/\w(?:[\w.-]{0,94}\w)?)?$")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or "\\" in name or name.count("/") > 1


def model_name_errors(*, name: str | None, field: str = "model", tokenizer_elsewhere: bool = False) -> dict[str, str]:
    """{field: message} when `name` is neither a usable local model directory nor a
    well-formed hub id. A hub id is not looked up (deployments run offline); a path must
    exist here, where the web process and the workers share storage, and hold what loading
    it needs: its config, its weights and, unless `tokenizer_elsewhere`, a tokenizer (a
    `tokenizer` field names a directory that must hold a tokenizer only)."""
    if not name:
        return {}
    path = Path(name).expanduser()
    try:
        exists = path.exists()
    except OSError as exc:  # a name the file system refuses (too long, …) is no model either
        return {field: f"{name[:80]!r}… is not a usable path: {exc.strerror}"}
    if exists:
        if not path.is_dir():
            return {field: f"{name} is a file: give the directory the model was saved in"}
        if field == "tokenizer":
            if not has_any(path, TOKENIZER, ("*.tiktoken",)):
                return {field: f"{name} has no tokenizer (tokenizer.json, tokenizer.model or vocab.json)"}
            return {}
        missing = model_dir_missing(path=path, tokenizer=not tokenizer_elsewhere)
        if missing:
            return {field: model_missing_said(name=name, missing=missing)}
        return {}
    if _looks_like_path(name):
        return {field: f"no such file or directory: {name} (give a local path that exists, or a hub id such as org/model)"}
    if not _HUB_ID.match(name) or "--" in name or ".." in name:
        return {field: f"{name!r} is neither an existing path nor a hub id such as org/model"}
    return {}


class _Importing(Protocol):
    """What the run's checks read of a taskset's background import (apps.buffer's Taskset)."""

    name: str
    import_status: str
    import_rows: int
    import_total: int | None
    import_error: str

    def refresh_from_db(self, *, fields: list[str]) -> None: ...


def _taskset_import_error(taskset: _Importing | None, *, starting: bool) -> str | None:
    """None for a taskset whose import is done (its tasks are checked as usual); else what
    its background import (apps/buffer/tasks.py) says: "" while it runs and the run is only
    created, a message when the run would start on it or the import failed."""
    if taskset is None:
        return None
    status = taskset.import_status
    if status != "ready":
        # A cached row may be minutes old: the import goes on in a worker.
        taskset.refresh_from_db(fields=["import_status", "import_rows", "import_total", "import_error"])
        status = taskset.import_status
    if status == "ready":
        return None
    if status == "failed":
        return f"taskset {taskset.name!r} could not be imported: {taskset.import_error}"
    if not starting:
        return ""
    total = f" of {taskset.import_total}" if taskset.import_total is not None else ""
    return (f"taskset {taskset.name!r} is still being imported ({taskset.import_rows}{total} rows so far); "
            "start the run when the import is done")


def run_spec_check(*, config: Mapping[str, object] | RunConfig, taskset: Any = None,
                   starting: bool = False) -> tuple[RunConfig | None, dict[str, str]]:
    """What stops a run from working, by field: the config (rewards and their params
    included), the model and tokenizer, and, when `starting`, tasks to explore; with the config
    it validated (None where it did not), which a form that goes on to create the run passes on
    (`run_create(config=cfg)`): the config is validated once per submit."""
    try:
        cfg = config_validate(data=config)
    except ConfigInvalid as exc:
        # Every problem at once: the model and the taskset are checked beside a config that
        # does not validate (a negative learning rate and a missing model in one answer).
        errors = dict(exc.errors)
        raw = config if isinstance(config, dict) else {}
        tokenizer = raw.get("tokenizer") if isinstance(raw.get("tokenizer"), str) else None
        for field, name in (("model", raw.get("model")), ("tokenizer", tokenizer)):
            if field not in errors and isinstance(name, str):
                errors.update(model_name_errors(name=name, field=field, tokenizer_elsewhere=bool(tokenizer)))
        pending = _taskset_import_error(taskset, starting=starting)
        if pending is not None:
            if pending:
                errors.setdefault("taskset", pending)
        elif taskset is not None and not taskset.tasks.exists():
            errors.setdefault("taskset", f"taskset {taskset.name!r} has no tasks")
        return None, errors
    errors = {**model_name_errors(name=cfg.model, tokenizer_elsewhere=bool(cfg.tokenizer)),
              **model_name_errors(name=cfg.tokenizer, field="tokenizer")}
    pending = _taskset_import_error(taskset, starting=starting)
    if pending is not None:
        if pending:
            errors["taskset"] = pending
    elif taskset is not None and not taskset.tasks.exists():
        errors["taskset"] = f"taskset {taskset.name!r} has no tasks"
    elif taskset is not None:
        # The rewards app's checks (kernel.plugin_names): every task domain routed to a term.
        errors.update(plugin_names.taskset_errors(config=cfg, taskset=taskset))
    elif starting and taskset is None and schedule.explores(cfg):
        errors["taskset"] = (f"a {cfg.mode} run explores tasks and this one has none: choose or upload a taskset, "
                             "or add tasks through the API, before starting")
    return cfg, errors


def run_name_errors(*, name: str) -> dict[str, str]:
    """{"name": message} for a name a run may not have, else {}."""
    try:
        _name_check(name)
    except ConfigInvalid as exc:
        return exc.errors
    return {}


def _name_check(name: str) -> None:
    if not name.strip():
        raise ConfigInvalid({"name": "a run needs a name"})
    try:
        text_check(name, field="name")
    except InputRejected as exc:
        raise ConfigInvalid({"name": exc.message}) from None
    limit = Run._meta.get_field("name").max_length or 0
    if len(name.strip()) > limit:
        raise ConfigInvalid({"name": f"at most {limit} characters"})


def run_create(*, name: str, owner: User, config: Mapping[str, object] | RunConfig, taskset: Any = None) -> Run:
    """Create a draft run; ConfigInvalid names each bad field. A RunConfig (one a form has
    validated already) is not validated again, nor is the row's config when the run is read."""
    errors = run_name_errors(name=name)
    cfg, spec_errors = run_spec_check(config=config, taskset=taskset)
    errors.update(spec_errors)
    if errors or cfg is None:
        raise ConfigInvalid(errors)
    run = Run.objects.create(name=name.strip(), owner=owner, config=config_dump(cfg), taskset=taskset)
    run.cfg_known(cfg)
    run_id = run.pk
    transaction.on_commit(lambda: runs_list_touch(run_id=run_id))  # open runs lists show it
    return run


def run_feedback_settings_update(*, run: Run, feedback: object, actor: Actor = None) -> Run:
    """Replace the run's feedback settings (validated with the whole config; ConfigInvalid
    names `feedback.<field>`), audited with the settings before and after."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        before = dict(locked.config.get("feedback") or {})
        cfg = config_validate(data={**locked.config, "feedback": feedback})
        after = config_dump(cfg)["feedback"]
        locked.config = config_dump(cfg)
        locked.save(update_fields=["config", "updated_at"])
        AuditEntry.objects.create(
            run=locked,
            actor=_audit_actor(actor),
            action="feedback_settings",
            detail={"before": before, "after": after},
        )
    run.refresh_from_db()
    transaction.on_commit(
        lambda: event_publish(
            run_id=run.pk, type="run.status", payload={"status": run.status, "action": "feedback_settings", "feedback": after}
        )
    )
    return run


_TRANSITIONS: dict[str, tuple[set[str], str]] = {
    "start": ({Run.Status.DRAFT, Run.Status.STOPPED, Run.Status.FAILED}, Run.Status.RUNNING),
    "pause": ({Run.Status.RUNNING}, Run.Status.PAUSED),
    "resume": ({Run.Status.PAUSED}, Run.Status.RUNNING),
    # A draft has nothing to stop; a finished run has nothing left to do.
    "stop": ({Run.Status.RUNNING, Run.Status.PAUSED}, Run.Status.STOPPED),
    # The system's: every step done (apps.control.conductor.run_finish) ...
    "finish": ({Run.Status.RUNNING}, Run.Status.FINISHED),
    # ... or its workers failed repeatedly (apps.runs.failures), with the reason.
    "fail": ({Run.Status.RUNNING, Run.Status.PAUSED}, Run.Status.FAILED),
}


# The statuses a run ends in. Every door that ends a run (the worker's failures through the
# ports, the loop's finish, the stop button, `rft run stop`) goes through run_transition, which
# sends `run_ended` (run_id, state, audit_id) inside the transition's transaction: the run's
# notifications (apps/control/notifications.py) are connected to it and queue on commit.
END_STATES = (Run.Status.FINISHED, Run.Status.FAILED, Run.Status.STOPPED)
run_ended = Signal()


def run_transition(*, run: Run, action: str, actor: Actor = None, reason: str = "") -> Run:
    """Move a run through its lifecycle with a conditional UPDATE, so two clicks or two
    processes cannot both win; audited and announced on the run's stream.

    A start checks the run's model, taskset and rewards first (RunCannotStart names each
    problem) and clears the error of an earlier failure; a fail stores `reason` as the run's
    error for the runs list and the run page, and in the audit entry."""
    if action not in _TRANSITIONS:
        raise TransitionNotAllowed(f"unknown action {action!r}")
    sources, target = _TRANSITIONS[action]
    if action == "start":
        run.refresh_from_db(fields=["config", "taskset"])
        errors = run_spec_check(config=run.config, taskset=run.taskset, starting=True)[1]
        if errors:
            raise RunCannotStart(errors)
    fields: dict[str, str] = {"status": target}
    if action == "fail":
        fields["error"] = (reason or "failed")[:4000]
    elif action == "start":
        fields["error"] = ""
    with transaction.atomic():
        changed = Run.objects.filter(pk=run.pk, status__in=sources).update(**fields)
        if not changed:
            run.refresh_from_db(fields=["status"])
            raise TransitionNotAllowed(f"cannot {action} a run that is {run.status}")
        audit = AuditEntry.objects.create(run=run, actor=_audit_actor(actor),
                                          action=action, detail={"reason": reason[:4000]} if reason else {})
        if target in END_STATES:
            run_ended.send(sender=Run, run_id=run.pk, state=target, audit_id=audit.pk)
    run.refresh_from_db()
    payload: Body = {"status": run.status, "action": action}
    if run.error:
        payload["error"] = run.error[:500]
    # A running run's steps are sent by the loop's next beat (apps/control/conductor.py),
    # which reads the status: start, pause and stop need nothing more.
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="run.status", payload=payload))
    return run


def run_explore_step_record(*, run: Run, step: int) -> None:
    """An explorer finished explore step `step` (in its write's transaction)."""
    from django.db.models import F, Value
    from django.db.models.functions import Greatest

    Run.objects.filter(pk=run.pk).update(explore_step=Greatest(F("explore_step"), Value(step)))


def run_explore_end(*, run: Run) -> bool:
    """Every epoch of the taskset is explored: exploring ends (explore_step = total_steps),
    so the trainer trains on what the buffer holds and the run finishes. True if this call
    ended it."""
    return bool(Run.objects.filter(pk=run.pk, explore_step__lt=run.cfg.total_steps).update(explore_step=run.cfg.total_steps))


def run_train_step_record(*, run_id: int, step: int) -> bool:
    """A trainer recorded step `step` (in the transaction that acks its batch); False when
    step - 1 was not the run's last (another trainer recorded it first)."""
    return bool(Run.objects.filter(pk=run_id, train_step=step - 1).update(train_step=step))


def model_version_publish(
    *, run: Run, number: int, checkpoint: str, train_step: int = 0, seconds: float | None = None, size: int | None = None
) -> ModelVersion:
    """Record a new model version (idempotent on (run, number)), make it the run's current
    one if newer, and announce `weights.synced` once the transaction commits (with the
    seconds the publish took and the bytes it moved, when the weight sync says)."""
    version, run.current_version = _version_insert(run=run, number=number, checkpoint=checkpoint,
                                                   train_step=train_step)
    payload: Body = {"version": number, "checkpoint": checkpoint, "train_step": train_step, "event": "published"}
    if seconds is not None:
        payload["seconds"] = seconds
    if size is not None:
        payload["bytes"] = size
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="weights.synced", payload=payload))
    cfg = run.cfg
    if cfg.eval_every and cfg.eval.taskset is not None and number % cfg.eval_every == 0:
        # On the rollout queue; the trainer goes on without waiting for it.
        run_id = run.pk
        transaction.on_commit(lambda: eval_dispatch(run_id=run_id, version=number))
    return version


def _version_insert(*, run: Run, number: int, checkpoint: str, train_step: int) -> tuple[ModelVersion, int]:
    """(the version row, the run's current version after it) in one statement, atomic as
    any statement is: a trainer publishes every step, and get_or_create, the update and a
    refresh in a transaction took seven round trips. The no-op DO UPDATE returns an existing
    row (a re-publish after a crash) unchanged, as get_or_create would."""
    from django.db import connection
    from django.utils import timezone

    versions, runs = ModelVersion._meta.db_table, Run._meta.db_table
    with connection.cursor() as cur:
        cur.execute(
            f"WITH v AS (INSERT INTO {versions} (run_id, number, checkpoint, train_step, created_at) "
            f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id, number) DO UPDATE SET number = EXCLUDED.number "
            f"RETURNING id, run_id, number, checkpoint, train_step, created_at), "
            f"r AS (UPDATE {runs} SET current_version = GREATEST(current_version, %s) WHERE id = %s "
            f"RETURNING current_version) "
            f"SELECT v.id, v.run_id, v.number, v.checkpoint, v.train_step, v.created_at, r.current_version FROM v, r",
            [run.pk, number, checkpoint, train_step, timezone.now(), number, run.pk],
        )
        row = cur.fetchone()
    if row is None:
        raise Run.DoesNotExist(f"run {run.pk} is gone")
    version = ModelVersion.from_db(connection.alias, ["id", "run_id", "number", "checkpoint", "train_step", "created_at"],
                                   list(row[:6]))
    return version, int(row[6])


def eval_dispatch(*, run_id: int, version: int) -> None:
    app.send_task("workers.explore.evaluation.evaluate", args=[run_id, version])


def eval_result_record(*, run: Run, version: int, step: int, values: dict[str, float]) -> int:
    """Store an evaluation's `eval/…` metrics at the version's train step and announce the
    result; returns the run's best version so far (by eval_best's default metric,
    earliest on ties; apps.runs.selectors.eval_best), which is also recorded as
    `eval/best_version`, or `version` while the metric has no value yet."""
    with transaction.atomic():
        metric_record(run=run, step=step, values=values)
        best = eval_best(run=run)
        number = best["version"] if best is not None else version
        metric_record(run=run, step=step, values={"eval/best_version": float(number)})
    payload: dict[str, object] = {"version": version, "step": step, "values": values, "best_version": number}
    if best is not None:
        payload.update(best_metric=best["metric"], best_label=best["label"], best_value=best["value"])
    transaction.on_commit(lambda: event_publish(run_id=run.pk, type="eval.result", payload=payload))
    return int(number)


def weight_load_record(
    *, run: Run, version: int, worker: str, seconds: float, size: int | None = None, via: str | None = None
) -> None:
    """An explorer loaded `version`: store it for the sync timeline and announce it (with
    the weight bytes it read or received and how: checkpoint, broadcast or memory)."""
    WeightLoad.objects.create(run=run, version=version, worker=worker, seconds=seconds)
    payload: Body = {"version": version, "worker": worker, "seconds": seconds, "event": "loaded"}
    if size is not None:
        payload["bytes"] = size
    if via is not None:
        payload["via"] = via
    event_publish(run_id=run.pk, type="weights.synced", payload=payload)


def sync_failure_record(*, run_id: int, version: int, method: str, stage: str, where: str, worker: str,
                        seconds: float, message: str) -> SyncFailure | None:
    """A weight sync or handover failed (workers.weights.sync.SyncFailed): store it for the weight-sync
    timeline and announce it as `weights.synced` with event `failed` (None: the run is gone).
    The step that raised it is recorded as a task failure by its own task, as any other."""
    run = Run.objects.filter(pk=run_id).only("pk").first()
    if run is None:
        return None
    failure = SyncFailure.objects.create(run=run, version=version, method=method[:40], stage=stage[:80],
                                         where=where[:1000], worker=worker[:200], seconds=seconds,
                                         message=message[:4000])
    event_publish(run_id=run_id, type="weights.synced", payload={
        "version": version, "event": "failed", "method": failure.method, "stage": failure.stage,
        "where": failure.where, "worker": failure.worker, "seconds": seconds, "message": failure.message[:500],
    })
    return failure


def _audit_actor(actor: Actor) -> User | None:
    """The audit entry's actor: a signed-in person, else no one."""
    return actor if isinstance(actor, User) and actor.is_authenticated else None


class MemberInvalid(InvalidInput):
    """A staffing change that cannot be made; `field` names the form field at fault."""

    code = "member_invalid"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


def run_member_add(*, run: Run, username: str, role: str, actor: Actor = None) -> RunMember:
    """Make `username` an annotator or viewer of the run (or change their role), audited."""
    from django.contrib.auth import get_user_model

    username = (username or "").strip()
    if not username:
        raise MemberInvalid("username", "give the username of the person to add")
    if role not in RunMember.Role.values:
        raise MemberInvalid("role", f"role must be one of: {', '.join(RunMember.Role.values)}")
    user = get_user_model().objects.filter(username=username, is_active=True).first()
    if user is None:
        raise MemberInvalid("username", f"no active user is called {username!r}")
    if user.pk == run.owner_id:
        raise MemberInvalid("username", f"{username} owns this run already")
    with transaction.atomic():
        member, created = RunMember.objects.update_or_create(run=run, user=user, defaults={"role": role})
        AuditEntry.objects.create(run=run, actor=_audit_actor(actor),
                                  action="member_add" if created else "member_role",
                                  detail={"user": username, "role": role})
    run_id = run.pk
    transaction.on_commit(lambda: runs_list_touch(run_id=run_id))  # the run appears on their list
    return member


def run_member_remove(*, run: Run, member_id: int, actor: Actor = None) -> None:
    """Take a member off the run, audited; their given feedback stays."""
    with transaction.atomic():
        member = RunMember.objects.select_related("user").filter(run=run, pk=member_id).first()
        if member is None:
            raise MemberInvalid("member", "no such member of this run")
        member.delete()
        AuditEntry.objects.create(run=run, actor=_audit_actor(actor),
                                  action="member_remove", detail={"user": member.user.get_username(), "role": member.role})
    run_id = run.pk
    transaction.on_commit(lambda: runs_list_touch(run_id=run_id))
