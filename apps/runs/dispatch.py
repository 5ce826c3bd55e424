"""The one scheduling mechanism of the project: a `Dispatch` row per run, job and key, moved
between idle, sent and running only by conditional UPDATEs, so that of any number of
processes asking at once exactly one wins (the row's previous state is part of the WHERE).

Every background job that must not run twice at once claims its row here:
- the RFT loop's explore and train steps (apps/control/conductor.py sends them and takes
  back those whose worker died, by heartbeat and trainer lock);
- reward-model training (workers/reward/trainer.py) and K-12 grader training
  (workers/reward/k12.py): one per run; a crashed one's row is free again when its lease runs out;
- a reward-model version's export (apps/rewards/rm_download.py, workers/reward/trainer.py): one
  per version (its key); queued (sent), then packing (running), with the last failure kept.

A row is out while it is sent or running and its lease (`expires_at`, none for the loop's
steps, which the conductor recovers) has not run out; `dispatch_claim` takes one that is not
out, or one its caller's own condition accepts, and makes it when it is missing.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from apps.runs.models import Dispatch

log = logging.getLogger(__name__)


def dispatch_free(now: datetime) -> Q:
    """Rows no job holds: idle, or held under a lease that ran out (its job crashed)."""
    return Q(state=Dispatch.State.IDLE) | Q(expires_at__lt=now)


@dataclass
class DispatchHold:
    """A task's hold on one dispatch row, for as long as it runs."""

    run_id: int
    job: str
    task_id: str
    step: int
    key: str = ""
    ended: bool = False

    def _row(self) -> QuerySet[Dispatch]:
        return Dispatch.objects.filter(run_id=self.run_id, job=self.job, key=self.key, task_id=self.task_id)

    def move_to(self, step: int) -> bool:
        """Go on with `step` in the same task (a trainer's chain); False if the row was taken
        back in the meantime (then the step is the loop's to send)."""
        if self._row().filter(state=Dispatch.State.RUNNING).update(step=step):
            self.step = step
            return True
        return False

    def end(self, *, error: str = "") -> None:
        """The task is done with it, whatever the outcome (`error`: its failure, kept on the
        row for the pages): the next claim may go. A database that is away leaves the row
        held; the conductor or the lease takes it back."""
        if self.ended:
            return
        self.ended = True
        try:
            self._row().exclude(state=Dispatch.State.IDLE).update(
                state=Dispatch.State.IDLE, worker="", holder="", started_at=None, expires_at=None, error=error[:500]
            )
        except Exception:
            log.exception("run %s: could not end the %s dispatch %s; it is taken back later", self.run_id,
                          self.job, self.task_id)


def dispatch_claim(
    *, run_id: int, job: str, state: str, key: str = "", when: Q | None = None, step: int = 0,
    task_id: str | None = None, worker: str = "", holder: str = "", lease_seconds: float | None = None,
) -> DispatchHold | None:
    """Move the row (run, job, key) to `state` (sent: a message is queued for it; running: a
    task runs it now) with one conditional UPDATE, if it is free (`dispatch_free`) or `when`
    (the caller's own condition, replacing that) holds; make it when there is none. None:
    another holds it. `lease_seconds`: after so long the row is free again, whatever its
    state (a job that crashed); None: only its holder or the conductor frees it."""
    now = timezone.now()
    task_id = task_id or uuid.uuid4().hex
    expires_at = now + timedelta(seconds=lease_seconds) if lease_seconds is not None else None
    fields: dict[str, object] = {"state": state, "step": step, "task_id": task_id, "worker": worker, "holder": holder,
                              "expires_at": expires_at, "error": ""}
    sent = state == Dispatch.State.SENT
    if sent:
        fields |= {"sent_at": now, "started_at": None, "copies": 1}
    else:
        fields["started_at"] = now
    rows = Dispatch.objects.filter(run_id=run_id, job=job, key=key)
    claimed = rows.filter(dispatch_free(now) if when is None else when).update(
        **fields, **({"sends": F("sends") + 1} if sent else {})
    )
    if not claimed:
        if rows.exists():
            return None
        try:
            with transaction.atomic():
                Dispatch.objects.create(run_id=run_id, job=job, key=key, sends=1 if sent else 0,
                                        **({"sent_at": now} | fields))
        except IntegrityError:
            return None  # another process made the row first, or the run is gone
    return DispatchHold(run_id=run_id, job=job, key=key, task_id=task_id, step=step)
