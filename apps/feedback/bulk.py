"""Bulk actions over a selection of a run's experiences (the experience browser's checkboxes,
Argilla style, and `POST /api/v1/runs/<id>/experiences/bulk`): one service per action, each
checking the person's role on the run, used by both doors.

- exclude (owner): rows not yet in a batch (ready, or pending people's feedback) leave
  training: status `filtered` with the reason "excluded by <who>" (the status they had is kept
  in the reason), so the trainer's claim (apps.buffer.services.batch_claim, status ready only)
  never takes them and no feedback makes them ready again. Rows leased to a trainer or already
  trained are skipped and counted.
- include (owner): rows excluded by a person go back to the status they had. Rows the data
  pipeline filtered are not a person's to bring back.
- flag (owner, annotator): a flag on each (the annotation page's flag, apps.feedback.kinds.flag).
- export (anyone on the run): the rows themselves as JSONL, exactly the selection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from apps.buffer.models import Experience
from apps.feedback.models import Feedback
from apps.feedback.kinds import kinds_that_flag
from apps.feedback.kinds.flag import feedback_flag
from apps.runs.events import labels_changed_publish
from apps.runs.models import AuditEntry, Run
from apps.runs.selectors import run_role
from kernel.exceptions import InvalidInput, NotAllowed

Person = AbstractBaseUser | AnonymousUser

# Most rows one action takes at once (a selection "all matching the filter" included).
BULK_MAX = 50_000
EXCLUDED = "excluded"


@dataclass(frozen=True)
class BulkAction:
    name: str
    label: str
    # The roles that may do it ('owner' includes staff).
    roles: tuple[str, ...]
    # What the confirmation asks, {n} the count.
    question: str


BULK_ACTIONS: dict[str, BulkAction] = {a.name: a for a in (
    BulkAction("exclude", "Exclude from training", ("owner",),
               "Exclude {n} experience(s) from training? The trainer will not take them; include them again any time."),
    BulkAction("include", "Include again", ("owner",), "Include {n} experience(s) in training again?"),
    BulkAction("flag", "Flag", ("owner", "annotator"), "Flag {n} experience(s)?"),
    BulkAction("export", "Export JSONL", ("owner", "annotator", "viewer"), "Export {n} experience(s) as JSONL?"),
)}


@dataclass(frozen=True)
class BulkResult:
    action: str
    # Rows the action changed (or wrote, for an export), and rows it left, with why.
    count: int
    skipped: int = 0
    why_skipped: str = ""


def bulk_allowed(*, run: Run, user: Person, action: str) -> None:
    """Raise unless `user` may do `action` on `run` (InvalidInput for an unknown action)."""
    if action not in BULK_ACTIONS:
        raise InvalidInput(f"unknown action {action!r}; use one of {', '.join(BULK_ACTIONS)}", field="action")
    role = run_role(run=run, user=user)
    if role not in BULK_ACTIONS[action].roles:
        raise NotAllowed(f"{BULK_ACTIONS[action].label.lower()} is for the run's "
                         f"{' or '.join(BULK_ACTIONS[action].roles)}", field="action")


def bulk_ids(*, run: Run, ids: Sequence[object]) -> list[int]:
    """The selection as ids of the run's experiences: every id a whole number, at least one,
    at most BULK_MAX; ids of other runs' experiences are refused, naming them."""
    if not ids:
        raise InvalidInput("select at least one experience", field="ids")
    if len(ids) > BULK_MAX:
        raise InvalidInput(f"at most {BULK_MAX} experiences at once (got {len(ids)})", field="ids")
    out: list[int] = []
    for raw in ids:
        text = str(raw).strip()
        if not text.isdigit():
            raise InvalidInput(f"{text[:40]!r} is not an experience id", field="ids")
        out.append(int(text))
    found = set(Experience.objects.filter(run=run, pk__in=out).values_list("pk", flat=True))
    missing = [i for i in out if i not in found]
    if missing:
        raise InvalidInput(f"not experiences of run {run.pk}: {', '.join(map(str, missing[:10]))}", field="ids")
    return sorted(set(out))


def _who(user: Person) -> str:
    return user.get_username() if user.is_authenticated else "someone"


def _audit(run: Run, user: Person, action: str, result: BulkResult) -> None:
    AuditEntry.objects.create(run=run, actor_id=user.pk if user.is_authenticated else None, action=f"bulk_{action}",
                              detail={"count": result.count, "skipped": result.skipped})


def experiences_exclude(*, run: Run, user: Person, ids: Sequence[int]) -> BulkResult:
    """Take the selected rows out of training (see the module's doc)."""
    bulk_allowed(run=run, user=user, action="exclude")
    count = 0
    with transaction.atomic():
        for status in (Experience.Status.READY, Experience.Status.PENDING):
            count += Experience.objects.filter(run=run, pk__in=ids, status=status).update(
                status=Experience.Status.FILTERED, filter_reason=f"{EXCLUDED} ({status}) by {_who(user)}"[:200],
                held_until=None)
        result = BulkResult("exclude", count, len(ids) - count,
                            "already in a training batch, trained, or filtered" if count < len(ids) else "")
        _audit(run, user, "exclude", result)
    return result


def experiences_include(*, run: Run, user: Person, ids: Sequence[int]) -> BulkResult:
    """Bring rows a person excluded back to the status they had."""
    bulk_allowed(run=run, user=user, action="include")
    count = 0
    with transaction.atomic():
        for status in (Experience.Status.READY, Experience.Status.PENDING):
            count += Experience.objects.filter(
                run=run, pk__in=ids, status=Experience.Status.FILTERED,
                filter_reason__startswith=f"{EXCLUDED} ({status})").update(status=status, filter_reason="")
        result = BulkResult("include", count, len(ids) - count,
                            "not excluded by a person" if count < len(ids) else "")
        _audit(run, user, "include", result)
    return result


def experiences_flag(*, run: Run, user: Person, ids: Sequence[int], reason: str = "") -> BulkResult:
    """Flag each selected row once (one the person flagged before is skipped)."""
    bulk_allowed(run=run, user=user, action="flag")
    already = Feedback.objects.filter(experience=OuterRef("pk"), kind__in=kinds_that_flag(), author_id=user.pk)
    todo = list(Experience.objects.filter(run=run, pk__in=ids).exclude(Exists(already)).order_by("pk"))
    with transaction.atomic():
        for exp in todo:
            feedback_flag(run=run, experience=exp, reason=reason or "flagged in the experience browser", author=user)
        result = BulkResult("flag", len(todo), len(ids) - len(todo), "flagged by you before" if len(todo) < len(ids) else "")
        _audit(run, user, "flag", result)
    return result


_EXPORT_FIELDS = ("pk", "group_id", "status", "filter_reason", "reward", "auto_reward", "human_reward",
                  "model_version", "is_expert", "task__domain", "prompt_text", "messages", "response_text")


def experiences_export(*, run: Run, user: Person, ids: Sequence[int]) -> Iterator[bytes]:
    """The selected rows as JSONL lines (one per experience, in id order), with whether each
    is flagged. Checks the person's role before the first line."""
    bulk_allowed(run=run, user=user, action="export")
    flagged = Exists(Feedback.objects.filter(experience=OuterRef("pk"), kind__in=kinds_that_flag()))
    rows = (Experience.objects.filter(Q(run=run) & Q(pk__in=list(ids))).annotate(flagged=flagged).order_by("pk")
            .values_list(*_EXPORT_FIELDS, "flagged"))

    def lines() -> Iterator[bytes]:
        for row in rows.iterator(chunk_size=2000):
            record = dict(zip((*_EXPORT_FIELDS, "flagged"), row, strict=True))
            record["id"] = record.pop("pk")
            record["domain"] = record.pop("task__domain")
            yield (json.dumps(record, ensure_ascii=False) + "\n").encode()

    return lines()


def experiences_bulk(*, run: Run, user: Person, action: str, ids: Sequence[int], reason: str = "") -> BulkResult:
    """The changing actions by name (the page's and the API's one dispatch); export has its own."""
    bulk_allowed(run=run, user=user, action=action)
    if action in ("exclude", "include"):
        result = (experiences_exclude if action == "exclude" else experiences_include)(run=run, user=user, ids=ids)
        # Dropped (or taken back) groups move their labels to or from "unused: filtered".
        labels_changed_publish(run_id=run.pk, why="filtered")
        return result
    if action == "flag":
        return experiences_flag(run=run, user=user, ids=ids, reason=reason)
    raise InvalidInput(f"{action} is not a changing action", field="action")
