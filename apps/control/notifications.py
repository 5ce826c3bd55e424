"""Telling people a run ended, W&B style: in the page header (an unread badge and the
notifications page) and by email.

One door: `run_transition` (apps/runs/services.py) sends `run_ended` for every end, whoever
caused it (the worker's failures through the ports, the loop's finish, the stop button, the
CLI). `_on_run_ended`, connected in ControlConfig.ready, queues `run_end_notify_task` with the
ids on commit; the task calls `run_end_notify`, which is idempotent on the end's key (run,
end state, the transition's audit entry): run twice, or retried after a lost email, it makes
no second row and sends no second email for a row already emailed.

Who: the run's owner and members get the in-app notification; the email goes to those whose
preference says so (`notification_email_wanted`: on for the owner, off for members, unless
they chose otherwise). The message names the run, its end state, the failure's reason, the key
figures of the run's summary (apps/control/summary.py) and links to the summary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from apps.control.summary import RunSummary, run_summary
from apps.runs.events import event_publish
from apps.runs.models import Notification, NotificationPreference, Run, RunMember
from apps.runs.services import END_STATES
from apps.runs.services import run_ended

log = logging.getLogger(__name__)

END_WORDS: dict[str, str] = {Run.Status.FINISHED: "finished", Run.Status.FAILED: "failed", Run.Status.STOPPED: "was stopped"}


def notification_key(*, run_id: int, state: str, audit_id: int) -> str:
    return f"run:{run_id}:{state}:{audit_id}"


def summary_url(*, run: Run) -> str:
    """The absolute link to the run's summary (RFT_SITE_URL + the run page's summary anchor)."""
    return settings.RFT_SITE_URL.rstrip("/") + reverse("runs:detail", kwargs={"run_id": run.pk}) + "#summary"


def notification_email_wanted(*, run: Run, user: User) -> bool:
    """The person's choice for this run, else the default: on for the owner, off for members."""
    choice = NotificationPreference.objects.filter(run=run, user=user).values_list("email", flat=True).first()
    return bool(user.pk == run.owner_id) if choice is None else bool(choice)


def notification_preference_set(*, run: Run, user: User, email: bool) -> None:
    """`user` (the owner or a member of `run`) wants, or no longer wants, an email when it ends."""
    if user.pk != run.owner_id and not RunMember.objects.filter(run=run, user=user).exists():
        raise PermissionError("only the run's owner and members get its notifications")
    NotificationPreference.objects.update_or_create(run=run, user=user, defaults={"email": email})


def _recipients(run: Run) -> list[User]:
    ids = {run.owner_id, *RunMember.objects.filter(run=run).values_list("user_id", flat=True)}
    return list(User.objects.filter(pk__in=ids, is_active=True).order_by("pk"))


def _figures(summary: RunSummary | None) -> list[str]:
    """The summary's key figures as lines of text (the same selectors as the summary page)."""
    if summary is None:
        return []
    lines = [f"Steps: explored {summary.explore_step}, trained {summary.train_step} of {summary.total_steps}",
             f"Model versions: {summary.versions}"]
    if summary.duration is not None:
        lines.insert(0, f"Ran for {str(summary.duration).split('.')[0]}")
    for move in summary.metrics:
        lines.append(f"{move.label}: {move.start:.3f} → {move.end:.3f} (best {move.best:.3f} at step {move.best_step})")
    if summary.labels_total:
        lines.append(f"Labels: {summary.labels_total} from {len(summary.labellers)} "
                     f"{'person' if len(summary.labellers) == 1 else 'people'}")
    if summary.ledger is not None and summary.ledger.run.total:
        c = summary.ledger.run
        lines.append(f"Where the labels went: {c.line()}")
    if summary.best is not None:
        lines.append(f"Best version: v{summary.best.number} ({summary.best.reason})")
    return lines


@dataclass(frozen=True)
class EndMessage:
    subject: str
    body: str


def end_message(*, run: Run, state: str, reason: str) -> EndMessage:
    subject = f"Run “{run.name}” (#{run.pk}) {END_WORDS.get(state, state)}"
    lines = [f"The run “{run.name}” (#{run.pk}) {END_WORDS.get(state, state)}."]
    if state == Run.Status.FAILED:
        lines.append(f"Why it failed: {reason or 'no reason recorded'}")
    lines.append("")
    lines += _figures(run_summary(run=run))
    lines += ["", f"Its summary: {summary_url(run=run)}", "",
              "You get this email because you own or joined this run; turn it off on your notifications page."]
    return EndMessage(subject=subject, body="\n".join(lines) + "\n")


def run_end_notify(*, run_id: int, audit_id: int) -> int:
    """Tell the people of run `run_id` that it ended (the transition audited as `audit_id`):
    one notification each, then the emails not sent yet. Idempotent; returns how many emails
    this call sent. An email backend error propagates (the task retries; rows already
    emailed are not emailed again)."""
    run = Run.objects.filter(pk=run_id).first()
    audit = run.audit.filter(pk=audit_id).first() if run is not None else None
    if run is None or audit is None:
        return 0
    state = {"finish": Run.Status.FINISHED, "fail": Run.Status.FAILED, "stop": Run.Status.STOPPED}.get(audit.action)
    if state not in END_STATES:
        return 0
    reason = str(audit.detail.get("reason", "")) if state == Run.Status.FAILED else ""
    key = notification_key(run_id=run.pk, state=state, audit_id=audit.pk)
    created = []
    for user in _recipients(run):
        note, made = Notification.objects.get_or_create(user=user, key=key,
                                                        defaults={"run": run, "state": state, "reason": reason})
        if made:
            created.append(user.pk)
    if created:
        transaction.on_commit(lambda: event_publish(run_id=run.pk, type="notification.created",
                                                    payload={"state": state, "count": len(created)}))
    sent = 0
    message: EndMessage | None = None
    pending = Notification.objects.filter(key=key, emailed_at__isnull=True).select_related("user")
    for note in pending:
        if not notification_email_wanted(run=run, user=note.user):
            continue
        if not note.user.email:
            # Told to the person on /notifications/ and their account page (issue 45 item 1).
            log.warning("run %s %s: no email to %s, who has no email address set", run.pk, state,
                        note.user.get_username())
            continue
        with transaction.atomic():
            # One sender per row: a second task running at once skips what the first holds.
            locked = (Notification.objects.select_for_update(skip_locked=True)
                      .filter(pk=note.pk, emailed_at__isnull=True).first())
            if locked is None:
                continue
            message = message or end_message(run=run, state=state, reason=reason)
            send_mail(subject=message.subject, message=message.body, from_email=None, recipient_list=[note.user.email])
            Notification.objects.filter(pk=note.pk).update(emailed_at=timezone.now())
            sent += 1
    return sent


def notifications_for(*, user: User, limit: int = 100) -> list[Notification]:
    return list(Notification.objects.filter(user=user).select_related("run")[:limit])


def notifications_unread_count(*, user: User) -> int:
    return Notification.objects.filter(user=user, read_at__isnull=True).count()


def notifications_mark_read(*, user: User, ids: list[int] | None = None) -> int:
    """Mark `user`'s notifications read (those of `ids`, or all); someone else's are untouched."""
    qs = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        qs = qs.filter(pk__in=ids)
    return qs.update(read_at=timezone.now())


def notification_runs(*, user: User) -> list[tuple[Run, bool]]:
    """The runs `user` owns or joined, each with whether an email is wanted when it ends."""
    runs = list(Run.objects.filter(Q(owner_id=user.pk) | Q(members__user=user)).distinct().order_by("-created_at")[:200])
    choices = dict(NotificationPreference.objects.filter(user=user, run__in=runs).values_list("run_id", "email"))
    return [(run, bool(choices.get(run.pk, run.owner_id == user.pk))) for run in runs]


def _on_run_ended(sender: object, run_id: int, state: str, audit_id: int, **_: object) -> None:
    # The tasks module also connects the workers' signal handlers, which only a worker loads.
    # cycle: apps.control.tasks imports this module (its task calls run_end_notify).
    from apps.control.tasks import run_end_notify_task

    # robust: a broker that is down loses the notification (logged), never the end itself
    # (the stop button's answer, the worker's failure record).
    transaction.on_commit(lambda: run_end_notify_task.delay(run_id, audit_id), robust=True)


def notifications_connect() -> None:
    run_ended.connect(_on_run_ended, dispatch_uid="apps.control.notifications")
