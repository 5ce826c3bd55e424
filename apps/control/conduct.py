"""The RFT core's loop as a Celery beat task (autodiscovered as `apps.control.conduct`, see
rftweb/celery.py; apps/control/tasks.py is the dashboard's). Thin: the decisions live in
`apps.control.orchestration`.
"""

from __future__ import annotations

from celery import shared_task

from apps.control.orchestration import runs_conduct


# Not acked late and never retried: a lost or failed beat is replaced by the next one, a
# fraction of a second later; the beat schedule lets a queued beat expire rather than pile up.
@shared_task(name="apps.control.conduct.runs_conduct_task", ignore_result=True, acks_late=False, time_limit=60,
             soft_time_limit=50)
def runs_conduct_task() -> list[int]:
    return sorted(runs_conduct())
